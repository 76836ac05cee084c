"""The whole ``python evaluate.py`` against the floor of any evaluation, in child processes: the measurement
behind ``benchmarks/evaluate_memory.py --evaluate`` (goal: peak RSS ≤ 1.5× a bf16 checkpoint).

Three children, each its own process so ``ru_maxrss`` is its own: one that imports evaluate.py's modules and runs
the model's first forward (the RSS after the imports is subtracted from every peak), evaluate.py itself (through
a parent whose only child it is), and one bare Hugging Face forward over the same sentences at the same batch
size.  ``--repeat`` runs the last two alternately and :func:`median_fields` reports the medians.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_LOAD_CHILD = """
import json, resource, runpy
runpy.run_path({script!r}, run_name="benchmark")  # evaluate.py's imports, nothing run
imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
from outlierlab.models.loading import FrozenEncoder
list(FrozenEncoder({model!r}, dtype={dtype!r}, device="cpu").encode(["Anne Elliot walked to the Cobb."]))
print(json.dumps({{"imports_kib": imports, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}}))
"""
# the floor: a bare Hugging Face forward over the same sentences at the same batch size, nothing kept
_BARE_CHILD = """
import json, resource, sys
sys.path.insert(0, {root!r})
import torch
from transformers import AutoModel, AutoTokenizer
from outlierlab.datamodules.probe_data import load_position_texts
imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
texts = load_position_texts(None, {n})
tok = AutoTokenizer.from_pretrained({model!r})
model = AutoModel.from_pretrained({model!r}, dtype=getattr(torch, {dtype!r})).eval()
ids = tok(texts, truncation=True, max_length=512)["input_ids"]
order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
with torch.inference_mode():
    for s in range(0, len(order), {batch_size}):
        model(**tok.pad([{{"input_ids": ids[i]}} for i in order[s:s + {batch_size}]], return_tensors="pt"))
print(json.dumps({{"imports_kib": imports, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}}))
"""


def bare_forward_run(model: str, n: int, dtype: str, batch_size: int) -> dict:
    """Peak RSS (KiB) of a process that runs one bare HF forward over the ``n`` sentences, with its RSS after
    the imports: the memory no evaluation of this model at this batch size can go below."""
    code = _BARE_CHILD.format(root=str(ROOT), model=model, n=n, dtype=dtype, batch_size=batch_size)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT))
    if res.returncode != 0:
        sys.exit(f"evaluate_memory.py --evaluate: the bare-forward child failed: "
                 f"{(res.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# a fresh process whose only child is evaluate.py: RUSAGE_CHILDREN's high-water mark is evaluate.py's own
_EVALUATE_PARENT = """
import json, resource, subprocess, sys
rc = subprocess.run([sys.executable] + {argv!r}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
print(json.dumps({{"rc": rc.returncode, "error": (rc.stderr.strip().splitlines() or [""])[-1],
                  "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}}))
"""


def evaluate_run(model: str, n: int, wic_pairs: int, dtype: str, out_dir: str, load_only: bool = False,
                 batch_size: int = 32) -> dict:
    """Peak RSS (KiB) of ``python evaluate.py`` on ``model`` (``load_only``: of a process that imports
    evaluate.py's modules and runs the model's first forward, with its RSS after the imports)."""
    script = str(ROOT / "evaluate.py")
    if load_only:
        code = _LOAD_CHILD.format(script=script, model=model, dtype=dtype)
    else:
        code = _EVALUATE_PARENT.format(argv=[script, f"encoder.name_or_path={model}", f"encoder.dtype={dtype}",
                                             "encoder.device=cpu", f"encoder.batch_size={batch_size}",
                                             f"data.max_sentences={n}",
                                             f"wic.max_pairs={wic_pairs}", "tensorboard=false", "progress=false",
                                             f"hydra.run.dir={out_dir}",
                                             "transform.allow_degenerate=true"])  # memory, not a fit: few tokens for d
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT))
    out = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 and res.stdout.strip() else None
    if out is None or out.get("rc", 0) != 0:
        why = out["error"] if out else (res.stderr.strip().splitlines() or ["?"])[-1]
        sys.exit(f"evaluate_memory.py --evaluate: the evaluate.py child failed: {why}")
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def evaluate_fields(run: dict, loaded: dict, checkpoint_bytes: int) -> dict:
    """The JSON fields of ``--evaluate`` (pure arithmetic): peaks in MiB and (peak − imports) / checkpoint."""
    mib, ckpt = 1024, checkpoint_bytes / 2**20  # ru_maxrss is in KiB
    imports, peak, load_peak = loaded["imports_kib"] / mib, run["peak_kib"] / mib, loaded["peak_kib"] / mib
    return {"imports_rss_mb": round(imports, 1), "load_and_forward_peak_mb": round(load_peak, 1),
            "evaluate_peak_rss_mb": round(peak, 1), "checkpoint_mb": round(ckpt, 1),
            "peak_over_checkpoint": round((peak - imports) / ckpt, 3) if ckpt else None,
            "load_over_checkpoint": round((load_peak - imports) / ckpt, 3) if ckpt else None,
            "wall_s": run["wall_s"]}


def median_fields(runs: list[dict], bares: list[dict], loaded: dict, checkpoint_bytes: int) -> dict:
    """``--evaluate`` fields over ``--repeat`` runs: the median run's (by peak RSS; the upper median of an even
    count) plus every run's ratio, and the bare forward's median ratio beside them (pure arithmetic)."""
    ckpt_mb = checkpoint_bytes / 2**20
    by_peak = sorted(runs, key=lambda r: r["peak_kib"])
    out = evaluate_fields(by_peak[len(by_peak) // 2], loaded, checkpoint_bytes)
    out["runs_peak_over_checkpoint"] = [evaluate_fields(r, loaded, checkpoint_bytes)["peak_over_checkpoint"]
                                        for r in runs]
    bare = sorted(round((b["peak_kib"] - b["imports_kib"]) / 1024 / ckpt_mb, 3) for b in bares)
    out["bare_forward_peak_mb"] = round(sorted(b["peak_kib"] for b in bares)[len(bares) // 2] / 1024, 1)
    out["bare_forward_over_checkpoint"] = bare[len(bare) // 2]
    out["runs_bare_forward_over_checkpoint"] = bare
    return out
