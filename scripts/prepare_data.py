#!/usr/bin/env python
"""Build the tokenizer and the token file of a training configuration, and nothing else (no model, no GPU).

    python scripts/prepare_data.py experiment=paper_roberta_base            # the full Wikipedia dump
    python scripts/prepare_data.py data=files 'data.files=[/data/a.txt.gz]' data.num_proc=32

Takes the same overrides as ``train.py`` (the config is ``configs/train.yaml`` composed with them) and runs
``MLMDataModule.prepare_data()`` then ``setup()``: the byte-level BPE (unless ``tokenizer.name_or_path``) and the
memory-mapped token file land in the cache (``data.cache_dir``), where every later ``train.py`` run and every DDP
rank finds them.  For a corpus whose build takes hours, run this first (on a CPU node, or the GPU node before
the job), so a multi-GPU job does not hold its GPUs while one process tokenizes.  Progress lines at INFO;
prints the token file and its counts at the end.  See docs/data_pipeline.md.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(overrides: list[str]) -> dict:
    from hydra.utils import instantiate

    from outlierlab.configuration.composing import compose_config

    cfg = compose_config("train", overrides)
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    keys = ("token_file", "dtype", "documents", "tokens", "blocks", "block_size", "train_blocks", "val_blocks")
    return {k: dm.stats[k] for k in keys} | {"cached": dm.cache_hits}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        print(main(sys.argv[1:]))
    except (ValueError, FileNotFoundError, ConnectionError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
