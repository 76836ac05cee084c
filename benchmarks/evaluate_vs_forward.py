#!/usr/bin/env python
"""The default ``evaluate.py`` against ONE bare Hugging Face forward over the same sentences, in one process.

    python benchmarks/evaluate_vs_forward.py                    # all-MiniLM-L6-v2, the 2,000 default sentences
    python benchmarks/evaluate_vs_forward.py --n 500 --two-pass # also the two-pass reference (data.one_pass=false)

The bare forward is what any script would do: tokenize, pad the batch (sorted by length, the batch size of
``encoder.batch_size``), ``model(**batch)`` under ``inference_mode`` — no hidden states kept, nothing
computed.  ``evaluate`` is ``evaluate.evaluate(cfg)`` with the default config (outliers, anisotropy, isotropy,
self_similarity, WiC on the shipped WordNet pairs, transforms none/clip/whiten), TensorBoard and the progress
bar off.  Printed: both times, their ratio (goal <= 1.3; issue 39 measured ~3x before the one-pass design) and
each analysis' own seconds (WiC encodes its own pairs: that is the part beyond the sentences).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from outlierlab.jobs.startup import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return hydra_compose(config_name="evaluate", overrides=overrides)


def bare_forward(name: str, texts: list[str], batch_size: int) -> tuple[float, int]:
    """Seconds of one forward over ``texts`` (tokenization included) and the tokens it saw."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from outlierlab.models.encoder_source import resolve_encoder

    src = resolve_encoder(name)
    tok = AutoTokenizer.from_pretrained(src.tokenizer)
    model = AutoModel.from_pretrained(src.model).eval()
    t0 = time.perf_counter()
    ids = tok(texts, truncation=True)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    n_tok = 0
    with torch.inference_mode():
        for s in range(0, len(order), batch_size):
            rows = [{"input_ids": ids[i]} for i in order[s:s + batch_size]]
            batch = tok.pad(rows, return_tensors="pt")
            model(**batch)
            n_tok += int(batch["attention_mask"].sum())
    return time.perf_counter() - t0, n_tok


def run_evaluate(overrides: list[str]) -> tuple[float, dict]:
    spec = importlib.util.spec_from_file_location("evaluate_script", ROOT / "evaluate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = compose(overrides)
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        res = mod.evaluate(cfg, out)
        return time.perf_counter() - t0, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="evaluation sentences (data.max_sentences)")
    ap.add_argument("--encoder", default="all-minilm-l6-v2")
    ap.add_argument("--two-pass", action="store_true", help="also time data.one_pass=false (the reference)")
    a = ap.parse_args()
    import torch

    from outlierlab.datamodules.probe_data import load_position_texts

    texts = load_position_texts(None, a.n)
    common = [f"data.max_sentences={a.n}", f"encoder.name_or_path={a.encoder}", "tensorboard=false", "progress=false"]
    batch = int(compose(common).encoder.batch_size)
    bare_forward(a.encoder, texts[:64], batch)  # warm-up: first-call allocations, lazy imports
    fwd, n_tok = bare_forward(a.encoder, texts, batch)
    out = {"encoder": a.encoder, "sentences": len(texts), "tokens": n_tok, "threads": torch.get_num_threads(),
           "bare_forward_s": round(fwd, 2)}
    for label, extra in [("one_pass", ["data.one_pass=true"])] + ([("two_pass", ["data.one_pass=false"])]
                                                                 if a.two_pass else []):
        secs, res = run_evaluate(common + extra)
        per = {r.name: r.summary.get("seconds") for r in res["results"]}
        out[label] = {"evaluate_s": round(secs, 2), "ratio": round(secs / fwd, 2), "per_analysis_s": per,
                      "passes": res["meta"]["sentences"]["passes"]}
        print(f"[{label}] evaluate {secs:.1f} s vs bare forward {fwd:.1f} s over {len(texts)} sentences "
              f"({n_tok} tokens): {secs / fwd:.2f}x (goal <= 1.3); per analysis {per}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
