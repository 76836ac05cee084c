#!/usr/bin/env python
"""Peak memory and throughput of evaluate.py's streaming pass for N and 10·N sentences.

    python benchmarks/evaluate_memory.py                       # all-MiniLM-L6-v2, N = 100 and 1000
    python benchmarks/evaluate_memory.py --n 200 --encoder outputs/train/RUN

Each size runs in its own subprocess (``resource.getrusage`` high-water marks are per process) and does what
``python evaluate.py analyses=[outliers,anisotropy,self_similarity]`` does with all three transforms: the
fit pass and the apply pass of :func:`outlierlab.evaluation.streaming.run_sentence_pass` (outlier counts, whitener
sums, anisotropy reservoir, self-similarity and intra-sentence sums).  Reported per size: peak RSS, RSS
after loading the model (baseline), the growth during the pass, and tokens/s of the encoding.  Sentences
are the shipped Persuasion sentences, cycled when more are asked for (memory does not depend on content).
Goal: peak RSS(10·N) / peak RSS(N) ≤ 1.2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Before transformers/huggingface_hub are imported: they read the flag at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from outlierlab.datamodules.eval_data import load_sentences  # noqa: E402
from outlierlab.evaluation.streaming import pass_settings, run_sentence_pass  # noqa: E402
from outlierlab.models.loading import FrozenEncoder  # noqa: E402


def _rss_mb() -> float:
    """Current resident set size (Linux /proc), MiB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def evaluate_defaults():
    """configs/evaluate.yaml as evaluate.py composes it (the settings of the shared pass come from there)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name="evaluate")


def child(n: int, encoder: str, batch_size: int) -> dict:
    base = load_sentences()
    texts = [base[i % len(base)] for i in range(n)]
    enc = FrozenEncoder(encoder, batch_size=batch_size)
    list(enc.encode(texts[:2]))  # load the weights before the baseline
    baseline = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    st = run_sentence_pass(enc, texts, ["none", "clip", "whiten"], outlier_transforms=["none", "clip", "whiten"],
                           batch_size=batch_size, **pass_settings(evaluate_defaults()))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    tokens = sum(p.n_tokens for p in st.passes)
    return {"n": n, "peak_rss_mb": round(peak, 1), "baseline_rss_mb": round(baseline, 1),
            "growth_mb": round(peak - baseline, 1), "tokens": tokens, "passes": len(st.passes),
            "encode_tokens_per_s": round(st.tokens_per_s, 1), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "words": len(st.words)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100, help="small size N (the large one is factor x N)")
    ap.add_argument("--factor", type=int, default=10)
    ap.add_argument("--encoder", default="all-minilm-l6-v2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child, a.encoder, a.batch_size)))
        return
    results = []
    for n in (a.n, a.factor * a.n):
        cmd = [sys.executable, __file__, "--child", str(n), "--encoder", a.encoder, "--batch-size", str(a.batch_size)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        results.append(json.loads(out))
        r = results[-1]
        print(f"N={r['n']:>6}: peak RSS {r['peak_rss_mb']:.0f} MiB (baseline {r['baseline_rss_mb']:.0f}, "
              f"+{r['growth_mb']:.0f} during the pass), {r['tokens']} tokens in {r['passes']} passes, "
              f"{r['encode_tokens_per_s']:.0f} tokens/s, wall {r['wall_s']} s, cpu {r['cpu_s']} s", flush=True)
    small, large = results
    ratio = large["peak_rss_mb"] / small["peak_rss_mb"]
    growth = (large["growth_mb"] / small["growth_mb"]) if small["growth_mb"] > 0 else float("nan")
    print(f"peak RSS ratio {a.factor}N/N = {ratio:.3f} (goal <= 1.2); growth-during-pass ratio = {growth:.2f}")


if __name__ == "__main__":
    main()
