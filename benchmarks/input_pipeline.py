"""How fast train.py's input pipeline makes batches in one process: blocks cut from the memory-mapped token file,
stacked and masked (transformers' masking, seeded per batch), the work a DataLoader worker does.

What it says about a GPU: a device that consumes fewer tokens/s than one process makes is never starved once
the batches are made in workers (``data.num_workers=auto`` gives two per device process on an accelerator); with
``num_workers=0`` the training process spends the printed milliseconds per step making the batch itself.

    python benchmarks/input_pipeline.py                                   # the embedded corpus
    python benchmarks/input_pipeline.py data=english_large                # any train.py data override
    python benchmarks/input_pipeline.py --shapes 128x128,256x512 --batches 50

Shapes are ``batch x block``: 128x128 is the scale ladder's (configs/experiment/scale_ladder.yaml), 256x512
Luo et al.'s RoBERTa-base recipe (experiment=paper_roberta_base).  One torch thread, as in a worker.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="train.py overrides of the data, e.g. data=english_large")
    p.add_argument("--shapes", default="32x128,128x128,256x512", help="batch x block, comma-separated")
    p.add_argument("--batches", type=int, default=30, help="timed batches per shape (after one warm-up batch)")
    args = p.parse_args()
    import hydra

    from outlierlab.configuration.composing import compose_config

    torch.set_num_threads(1)
    print(f"{'batch x block':>14} {'ms/batch (median)':>18} {'tokens/s per process':>21}")
    for shape in args.shapes.split(","):
        batch, block = (int(x) for x in shape.lower().split("x"))
        cfg = compose_config("train", [*args.overrides, f"data.batch_size={batch}", f"data.block_size={block}",
                                       f"model.max_len={block}", "data.num_workers=0"])
        dm = hydra.utils.instantiate(cfg.data)
        dm.prepare_data()
        dm.setup("fit")
        loader = dm.train_dataloader()
        batches = iter(loader)
        next(batches)  # warm-up: the token file's first pages, the collator's first call
        times = []
        while len(times) < args.batches:
            t0 = time.perf_counter()
            try:
                next(batches)
            except StopIteration:  # a small corpus holds few batches of a large shape: the next epoch's order
                batches = iter(loader)
                continue
            times.append(time.perf_counter() - t0)
        ms = 1e3 * statistics.median(times)
        print(f"{shape:>14} {ms:18.1f} {batch * block / ms * 1e3:21,.0f}", flush=True)


if __name__ == "__main__":
    main()
