#!/usr/bin/env python
"""The default ``evaluate.py`` against ONE bare Hugging Face forward over the same sentences, in one process.

    python benchmarks/evaluate_vs_forward.py                    # all-MiniLM-L6-v2, the 2,000 default sentences
    python benchmarks/evaluate_vs_forward.py --n 500 --two-pass # also the two-pass reference (data.one_pass=false)
    python benchmarks/evaluate_vs_forward.py --n 300 wic.max_pairs=300   # any evaluate.py override after the flags
    python benchmarks/evaluate_vs_forward.py encoder.dtype=bfloat16      # on a GPU (encoder.device=auto: CUDA)

The bare forward is what any script would do: tokenize, pad the batch (sorted by length, the batch size of
``encoder.batch_size``), ``model(**batch)`` under ``inference_mode`` — no hidden states kept, nothing
computed.  ``evaluate`` is ``evaluate.evaluate(cfg)`` with the default config (outliers, anisotropy, isotropy,
self_similarity, WiC on the shipped WordNet pairs, transforms none/clip/whiten), TensorBoard and the progress
bar off.  Printed: evaluate's time against bare forwards over the sentences AND over WiC's own distinct sentences
(its ratio; goal <= 1.3, issue 39 measured ~3x before the one-pass design), the sentence analyses' seconds
against the forward over the sentences, and each analysis' own seconds.
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


def bare_forward(encoder_cfg, texts: list[str], batch_size: int) -> tuple[float, int]:
    """Seconds of one forward over ``texts`` (tokenization included) and the tokens it saw.

    The model is loaded as evaluate.py loads it (``encoder.*``: the same device, dtype, device_map and
    revision — on a GPU machine ``encoder.device=auto`` is CUDA, and a CPU forward would flatter the ratio), then
    driven as any script would: ``model(**batch)`` under ``inference_mode``, nothing kept.
    """
    import torch

    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder.from_config(encoder_cfg)
    tok, model, dev = enc.tokenizer, enc.model, enc.input_device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    ids = tok(texts, truncation=True)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    n_tok = 0
    with torch.inference_mode():
        for s in range(0, len(order), batch_size):
            rows = [{"input_ids": ids[i]} for i in order[s:s + batch_size]]
            batch = tok.pad(rows, return_tensors="pt")
            model(**{k: v.to(dev) for k, v in batch.items()})
            n_tok += int(batch["attention_mask"].sum())
    sync()  # CUDA runs asynchronously: the time is the kernels', not their launches'
    return time.perf_counter() - t0, n_tok


def wic_texts(cfg) -> list[str]:
    """The distinct sentences WiC encodes (its sweep split and its report split)."""
    from outlierlab.evaluation.settings import WicSettings, load_settings
    from outlierlab.evaluation.wic import load_pairs

    s = load_settings(WicSettings, cfg.wic)
    pairs = load_pairs(s)[0] + (load_pairs(s, split=str(s.report_split))[0] if s.report_split else [])
    return list(dict.fromkeys(t for p in pairs for t in (p["sentence1"], p["sentence2"])))


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
    ap.add_argument("overrides", nargs="*", help="more evaluate.py overrides, e.g. wic.max_pairs=500")
    a = ap.parse_args()
    import torch

    from outlierlab.datamodules.probe_data import load_position_texts

    texts = load_position_texts(None, a.n)
    common = [f"data.max_sentences={a.n}", f"encoder.name_or_path={a.encoder}", "tensorboard=false",
              "progress=false", *a.overrides]
    cfg = compose(common)
    batch = int(cfg.encoder.batch_size)
    wic = wic_texts(cfg) if "wic" in cfg.analyses else []
    bare_forward(cfg.encoder, texts[:64], batch)  # warm-up: first-call allocations, lazy imports
    fwd, n_tok = bare_forward(cfg.encoder, texts, batch)
    fwd_wic = bare_forward(cfg.encoder, wic, batch)[0] if wic else 0.0
    device = "cuda" if cfg.encoder.device == "auto" and torch.cuda.is_available() else str(cfg.encoder.device)
    out = {"encoder": a.encoder, "sentences": len(texts), "tokens": n_tok, "threads": torch.get_num_threads(),
           "device": device, "dtype": str(cfg.encoder.dtype),
           "bare_forward_s": round(fwd, 2), "wic_sentences": len(wic), "bare_forward_wic_s": round(fwd_wic, 2)}
    print(f"bare forward: {fwd:.1f} s over {len(texts)} sentences ({n_tok} tokens), {fwd_wic:.1f} s over WiC's "
          f"{len(wic)} distinct sentences", flush=True)
    sentence_part = ("outliers", "anisotropy", "isotropy", "self_similarity")
    for label, extra in [("one_pass", ["data.one_pass=true"])] + ([("two_pass", ["data.one_pass=false"])]
                                                                 if a.two_pass else []):
        secs, res = run_evaluate(common + extra)
        per = {r.name: r.summary.get("seconds") for r in res["results"]}
        sent = sum(v for k, v in per.items() if k in sentence_part)
        out[label] = {"evaluate_s": round(secs, 2), "ratio_all": round(secs / (fwd + fwd_wic), 2),
                      "sentence_analyses_s": round(sent, 2), "ratio_sentences": round(sent / fwd, 2),
                      "ratio_wic": round(per.get("wic", 0) / fwd_wic, 2) if fwd_wic else None,
                      "per_analysis_s": per, "passes": res["meta"]["sentences"]["passes"]}
        print(f"[{label}] evaluate {secs:.1f} s vs bare forwards {fwd + fwd_wic:.1f} s: {secs / (fwd + fwd_wic):.2f}x "
              f"(goal <= 1.3); sentence analyses {sent:.1f} s = {sent / fwd:.2f}x their forward; "
              f"WiC {per.get('wic', 0):.1f} s; per analysis {per}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
