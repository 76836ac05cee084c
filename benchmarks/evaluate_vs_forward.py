#!/usr/bin/env python
"""The default ``evaluate.py`` against ONE bare Hugging Face forward over the same sentences, in one process.

    python benchmarks/evaluate_vs_forward.py                    # all-MiniLM-L6-v2, the 2,000 default sentences
    python benchmarks/evaluate_vs_forward.py --n 500 --two-pass # also the two-pass reference (data.one_pass=false)
    python benchmarks/evaluate_vs_forward.py --repeat 3         # alternated rounds; quote the median ratio
    python benchmarks/evaluate_vs_forward.py --n 300 wic.max_pairs=300   # any evaluate.py override after the flags
    python benchmarks/evaluate_vs_forward.py encoder.dtype=bfloat16      # on a GPU (encoder.device=auto: CUDA)

The bare forward is what any script would do: tokenize, pad the batch (sorted by length, the batch size of
``encoder.batch_size``), ``model(**batch)`` under ``inference_mode`` — no hidden states kept, nothing
computed.  ``evaluate`` is ``evaluate.evaluate(cfg)`` with the default config (outliers, anisotropy, isotropy,
self_similarity, WiC on the shipped WordNet pairs, transforms none/clip/whiten), TensorBoard and the progress
bar off.  Printed: evaluate's time against bare forwards over the sentences AND over WiC's own distinct sentences
(its ratio; goal <= 1.5; about 3x before the one-pass design), the sentence analyses' seconds
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
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def compose(overrides: list[str]):
    from outlierlab.configuration.composing import compose_config

    return compose_config("evaluate", overrides)


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
    from outlierlab.configuration.analysis_settings import WicSettings
    from outlierlab.configuration.settings_store import load_settings
    from outlierlab.evaluation.analyses.wic import load_pairs

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


SENTENCE_PART = ("outliers", "anisotropy", "isotropy", "self_similarity")  # the analyses of the shared sentence pass


def ratios(secs: float, per: dict, fwd: float, fwd_wic: float) -> dict:
    """One evaluate's seconds against the bare forwards: over everything, the sentence analyses against the
    forward over the sentences, and WiC against the forward over its own sentences."""
    sent = sum(v for k, v in per.items() if k in SENTENCE_PART)
    return {"evaluate_s": round(secs, 2), "ratio_all": round(secs / (fwd + fwd_wic), 2),
            "sentence_analyses_s": round(sent, 2), "ratio_sentences": round(sent / fwd, 2),
            "ratio_wic": round(per.get("wic", 0) / fwd_wic, 2) if fwd_wic else None, "per_analysis_s": per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="evaluation sentences (data.max_sentences)")
    ap.add_argument("--encoder", default="all-minilm-l6-v2")
    ap.add_argument("--two-pass", action="store_true", help="also time data.one_pass=false (the reference)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="K bare-forward/evaluate rounds, alternated; the median ratio is the figure to quote "
                         "(one run moves by about ±0.05x on a shared 2-core machine)")
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
    device = str(cfg.encoder.device) if cfg.encoder.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    out = {"encoder": a.encoder, "sentences": len(texts), "threads": torch.get_num_threads(), "device": device,
           "dtype": str(cfg.encoder.dtype), "wic_sentences": len(wic), "runs": []}
    labels = [("one_pass", ["data.one_pass=true"])] + ([("two_pass", ["data.one_pass=false"])] if a.two_pass else [])
    for rep in range(a.repeat):  # bare forwards and evaluates alternated: the machine's drift hits both
        fwd, n_tok = bare_forward(cfg.encoder, texts, batch)
        fwd_wic = bare_forward(cfg.encoder, wic, batch)[0] if wic else 0.0
        run = {"tokens": n_tok, "bare_forward_s": round(fwd, 2), "bare_forward_wic_s": round(fwd_wic, 2)}
        print(f"[run {rep + 1}/{a.repeat}] bare forward: {fwd:.1f} s over {len(texts)} sentences ({n_tok} tokens), "
              f"{fwd_wic:.1f} s over WiC's {len(wic)} distinct sentences", flush=True)
        for label, extra in labels:
            secs, res = run_evaluate(common + extra)
            run[label] = ratios(secs, {r.name: r.summary.get("seconds") for r in res["results"]}, fwd, fwd_wic)
            run[label]["passes"] = res["meta"]["sentences"]["passes"]
            r = run[label]
            print(f"[run {rep + 1}/{a.repeat}, {label}] evaluate {secs:.1f} s vs bare forwards {fwd + fwd_wic:.1f} s: "
                  f"{r['ratio_all']:.2f}x (goal <= 1.5); sentence analyses {r['sentence_analyses_s']:.1f} s = "
                  f"{r['ratio_sentences']:.2f}x their forward; WiC {r['per_analysis_s'].get('wic', 0):.1f} s; "
                  f"per analysis {r['per_analysis_s']}", flush=True)
        out["runs"].append(run)
    for label, _ in labels:
        out[f"median_ratio_{label}"] = median(r[label]["ratio_all"] for r in out["runs"])
        print(f"{label}: median ratio {out[f'median_ratio_{label}']:.2f}x over {a.repeat} run(s): "
              f"{[r[label]['ratio_all'] for r in out['runs']]}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
