#!/usr/bin/env python
"""Peak memory and throughput of evaluate.py's streaming pass for N and 10·N sentences — and, with ``--llama``,
of a randomly initialised Llama saved in bfloat16 (peak RSS against the checkpoint's size).

    python benchmarks/evaluate_memory.py                       # all-MiniLM-L6-v2, N = 100 and 1000
    python benchmarks/evaluate_memory.py --n 200 --encoder outputs/train/RUN
    python benchmarks/evaluate_memory.py --llama 2048,18,5632,32000 --n 16   # ≈ 1.0B parameters, 2.0 GB in bf16
    python benchmarks/evaluate_memory.py --llama 1024,8,2816,32000 --n 16    # ≈ 0.13B (what fits a 2-core CPU)
    python benchmarks/evaluate_memory.py --device cuda --llama 4096,32,11008,32000 --n 256 --max-length 512
                                                                   # Llama-2-7B shape on a GPU: 6.6B, 13.2 GB bf16

Each size runs in its own subprocess (``resource.getrusage`` high-water marks are per process) and does what
``python evaluate.py analyses=[outliers,anisotropy,self_similarity]`` does with all three transforms:
:func:`outlierlab.evaluation.sentence_pass.run_sentence_pass` (outlier counts, whitener sums, anisotropy reservoir,
self-similarity and intra-sentence sums) — one pass, one layer at a time (``--two-pass``: the reference that
re-encodes).  Reported per size: peak RSS, RSS after the imports and after loading the model, the growth
during the pass, tokens/s, and the largest hidden state handed over by one layer (bytes per token per layer).
Sentences are the shipped Persuasion sentences, cycled when more are asked for.
Goals: peak RSS(10·N) / peak RSS(N) ≤ 1.2; with ``--llama``: (peak RSS − RSS after imports) ≤ 1.5 × checkpoint
size in bfloat16 (float32: the weights alone are 2×).

``--evaluate``: the whole ``python evaluate.py`` (its default analyses: outliers, anisotropy, isotropy,
self-similarity, WiC, STS, with none/clip/whiten) on the random Llama in bfloat16, ``data.max_sentences=N``
and ``wic.max_pairs=--wic-pairs``, in a child process: its peak RSS, against the RSS of a child that only
imports evaluate.py's modules and loads the model, and beside the same ratio for a child that runs one bare
Hugging Face forward over the same sentences at the same batch size (the floor of any evaluation).  One run's
peak moves by up to ±0.08× with where glibc places the forward's buffers (the same code measured 1.42× and 1.57×):
``--repeat K`` alternates K evaluate.py and K bare-forward children and reports the medians, with every run's ratio
(the children and their arithmetic: ``benchmarks/whole_evaluate_memory.py``).

``--device cuda`` (peak GPU memory and tokens/s on a GPU): the model is loaded the way evaluate.py loads
it — ``FrozenEncoder.from_config`` of configs/evaluate.yaml's ``encoder`` section with ``encoder.device=cuda`` and
``encoder.dtype`` (bfloat16 with ``--llama``; the random Llama is initialised on the GPU and saved to
``--save-dir`` like the CPU mode's, 13.2 GB of disk for the 7B shape, then read back from there) — and the same
sentence pass runs.  Reported per size: GPU memory allocated once the weights are loaded
(``torch.cuda.memory_allocated``; ``weights_gpu_mb``) and the loading peak, then, after
``torch.cuda.reset_peak_memory_stats``, the pass's ``max_memory_allocated`` / ``max_memory_reserved`` and its
growth over the weights, each against the checkpoint's size, the bytes one layer hands over, and tokens/s (of
the encoding, and of the whole pass with its statistics, synchronised), and peak RSS: the statistics' float64
state (whitener sums, reservoir) is kept in CPU memory.  With ``--llama`` only the ``--dtype`` row runs (default
bfloat16; the CPU mode adds a float32 row).  Without a CUDA GPU ``--device cuda`` stops with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Before transformers/huggingface_hub are imported: they read the flag at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from outlierlab.datamodules.eval_data import load_sentences  # noqa: E402
from outlierlab.evaluation.sentence_pass import (AnisotropyReservoir, OutlierCounts, WordSimilarity,  # noqa: E402
                                                pass_settings, run_sentence_pass)
from outlierlab.configuration.analysis_settings import AnisotropySettings  # noqa: E402
from outlierlab.configuration.settings_store import section_settings  # noqa: E402
from outlierlab.models.loading import FrozenEncoder  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module, also when loaded by path (tests)
from random_llama import check_saved_shape, ensure_random_llama  # noqa: E402,F401 (check_saved_shape: tests)
from whole_evaluate_memory import (bare_forward_run, evaluate_fields, evaluate_run,  # noqa: E402,F401 (fields: tests)
                                   median_fields)


def _rss_mb() -> float:
    """Current resident set size (Linux /proc), MiB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def evaluate_defaults():
    """configs/evaluate.yaml as evaluate.py composes it (the settings of the shared pass come from there)."""
    from outlierlab.configuration.composing import compose_config

    return compose_config("evaluate")


def _dir_size(path: str) -> int:
    p = Path(path)
    return sum(f.stat().st_size for f in p.glob("*.safetensors")) if p.is_dir() else 0


def no_cuda_message() -> str | None:
    """Why ``--device cuda`` cannot run here (one line), or None when it can."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (f"evaluate_memory.py: --device cuda needs a CUDA GPU, and torch {torch.__version__} ({build}) sees none "
            "here; run without --device for the CPU figures (peak RSS), or on a machine with a GPU")


def gpu_fields(raw: dict) -> dict:
    """The JSON fields of a ``--device cuda`` size from the raw measurements (bytes, seconds; pure arithmetic).

    ``weights_bytes``: ``torch.cuda.memory_allocated()`` once the model is loaded (and one warm-up batch freed);
    ``load_peak_bytes``: ``max_memory_allocated()`` up to then; ``pass_peak_allocated_bytes`` /
    ``pass_peak_reserved_bytes``: ``max_memory_allocated()`` / ``max_memory_reserved()`` of the pass, counted from
    ``reset_peak_memory_stats()`` after loading, so they include the weights, which stay allocated."""
    mib = 2**20
    weights, ckpt = raw["weights_bytes"], raw["checkpoint_bytes"]
    peak, reserved = raw["pass_peak_allocated_bytes"], raw["pass_peak_reserved_bytes"]
    growth = peak - weights

    def ratio(a: float, b: float):
        return round(a / b, 3) if b else None

    return {"n": raw["n"], "dtype": raw["dtype"], "one_pass": raw["one_pass"], "device": "cuda", "gpu": raw["gpu"],
            "weights_gpu_mb": round(weights / mib, 1), "load_peak_gpu_mb": round(raw["load_peak_bytes"] / mib, 1),
            "peak_gpu_allocated_mb": round(peak / mib, 1), "peak_gpu_reserved_mb": round(reserved / mib, 1),
            "growth_gpu_mb": round(growth / mib, 1), "checkpoint_mb": round(ckpt / mib, 1),
            "weights_over_checkpoint": ratio(weights, ckpt), "peak_over_checkpoint": ratio(peak, ckpt),
            "reserved_over_checkpoint": ratio(reserved, ckpt), "growth_over_weights": ratio(growth, weights),
            "peak_rss_mb": round(raw["peak_rss_kib"] / 1024, 1),
            "layer_max_bytes": raw["layer_max_bytes"], "layer_bytes_per_token": raw["layer_bytes_per_token"],
            "layers": raw["layers"], "hidden": raw["hidden"], "tokens": raw["tokens"], "passes": raw["passes"],
            "encode_tokens_per_s": round(raw["tokens"] / raw["encode_s"], 1) if raw["encode_s"] > 0 else None,
            "tokens_per_s": round(raw["tokens"] / raw["wall_s"], 1) if raw["wall_s"] > 0 else None,
            "wall_s": round(raw["wall_s"], 1), "cpu_s": round(raw["cpu_s"], 1), "words": raw["words"]}


def gpu_line(r: dict) -> str:
    """One printed line of a ``--device cuda`` size (the CPU mode's style)."""
    return (f"N={r['n']:>6} {r['dtype']:>8} {'1 pass ' if r['one_pass'] else '2 passes'} on {r['gpu']}: GPU weights "
            f"{r['weights_gpu_mb']:.0f} MiB (loading peak {r['load_peak_gpu_mb']:.0f}), pass peak allocated "
            f"{r['peak_gpu_allocated_mb']:.0f} MiB / reserved {r['peak_gpu_reserved_mb']:.0f} "
            f"(+{r['growth_gpu_mb']:.0f} over the weights; checkpoint {r['checkpoint_mb']:.0f} MiB -> peak / "
            f"checkpoint = {r['peak_over_checkpoint']}, growth / weights = {r['growth_over_weights']}), peak RSS "
            f"{r['peak_rss_mb']:.0f} MiB, one layer "
            f"{r['layer_bytes_per_token']:.0f} B/token ({r['layer_max_bytes'] / 2**20:.1f} MiB at most), "
            f"{r['tokens']} tokens, {r['encode_tokens_per_s']} tokens/s encoding, {r['tokens_per_s']} tokens/s with "
            f"the statistics, wall {r['wall_s']} s")


def _timed_pass(enc, texts: list[str], batch_size: int, one_pass: bool, cfg=None, sync=lambda: None):
    """evaluate's sentence pass over ``texts`` with none/clip/whiten, its settings from ``cfg`` (None: composed
    inside the timing, as the CPU mode always did); (stats, the largest layer handed over, wall s, CPU s)."""
    layer_bytes = {"max": 0, "per_token": 0.0}
    forward_layers = enc.forward_layers

    def measured(ids, attn, fn):  # the largest hidden state one layer hands over
        def wrap(i, h):
            b = h.numel() * h.element_size()
            if b > layer_bytes["max"]:
                layer_bytes.update(max=b, per_token=b / (h.shape[0] * h.shape[1]), dtype=str(h.dtype))
            fn(i, h)
        forward_layers(ids, attn, wrap)

    enc.forward_layers = measured
    t0, c0 = time.perf_counter(), time.process_time()
    cfg = evaluate_defaults() if cfg is None else cfg
    settings = pass_settings(cfg)
    settings["data"] = replace(settings["data"], one_pass=one_pass)
    # memory, not a fit: few tokens for d may make the whitening degenerate
    settings["transform"] = replace(settings["transform"], allow_degenerate=True)
    names = ("none", "clip", "whiten")
    # the subscribers of the outliers, anisotropy and self-similarity analyses
    consumers = [*(OutlierCounts(t, enc.num_layers + 1) for t in names),
                 AnisotropyReservoir(section_settings(AnisotropySettings, cfg).n_sentences, settings["seed"]),
                 *(WordSimilarity(t) for t in names)]
    st = run_sentence_pass(enc, texts, list(names), consumers=consumers, need_whitener=True, batch_size=batch_size,
                           **settings)
    sync()
    return st, layer_bytes, time.perf_counter() - t0, time.process_time() - c0


def child(n: int, encoder: str, batch_size: int, dtype: str = "float32", one_pass: bool = True,
          max_length: int | None = None) -> dict:
    base = load_sentences()
    texts = [base[i % len(base)] for i in range(n)]
    imports = _rss_mb()
    enc = FrozenEncoder(encoder, max_length=max_length, batch_size=batch_size, dtype=dtype, device="cpu")
    list(enc.encode(texts[:2]))  # load the weights before the baseline
    baseline = _rss_mb()
    st, layer_bytes, wall, cpu = _timed_pass(enc, texts, batch_size, one_pass)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    tokens = sum(p.n_tokens for p in st.passes)
    ckpt = _dir_size(enc.source.model) / 2**20
    return {"n": n, "dtype": dtype, "one_pass": one_pass, "peak_rss_mb": round(peak, 1),
            "imports_rss_mb": round(imports, 1), "baseline_rss_mb": round(baseline, 1),
            "growth_mb": round(peak - baseline, 1), "checkpoint_mb": round(ckpt, 1),
            "peak_over_checkpoint": round((peak - imports) / ckpt, 3) if ckpt else None,
            "layer_max_bytes": layer_bytes["max"], "layer_bytes_per_token": layer_bytes["per_token"],
            "layers": enc.num_layers + 1, "hidden": enc.hidden_size, "tokens": tokens, "passes": len(st.passes),
            "encode_tokens_per_s": round(st.tokens_per_s, 1), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "words": len(st.words)}


def child_cuda(n: int, encoder: str, batch_size: int, dtype: str = "bfloat16", one_pass: bool = True,
               max_length: int | None = None) -> dict:
    """One size on the GPU, loaded as evaluate.py loads it (its config's ``encoder`` section, device cuda)."""
    import torch

    base = load_sentences()
    texts = [base[i % len(base)] for i in range(n)]
    cfg = evaluate_defaults()
    e = cfg.encoder
    e.name_or_path, e.device, e.dtype, e.batch_size, e.max_length, e.device_map = \
        encoder, "cuda", dtype, batch_size, max_length, None
    enc = FrozenEncoder.from_config(e)
    torch.cuda.reset_peak_memory_stats()
    list(enc.encode(texts[:2]))  # load the weights (and warm the kernels) before the pass
    torch.cuda.synchronize()
    weights, load_peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    st, layer_bytes, wall, cpu = _timed_pass(enc, texts, batch_size, one_pass, cfg, sync=torch.cuda.synchronize)
    return gpu_fields({
        "n": n, "dtype": dtype, "one_pass": one_pass, "gpu": torch.cuda.get_device_name(),
        "weights_bytes": weights, "load_peak_bytes": load_peak,
        "pass_peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "pass_peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "checkpoint_bytes": _dir_size(enc.source.model),
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "layer_max_bytes": layer_bytes["max"], "layer_bytes_per_token": layer_bytes["per_token"],
        "layers": enc.num_layers + 1, "hidden": enc.hidden_size, "tokens": sum(p.n_tokens for p in st.passes),
        "passes": len(st.passes), "encode_s": st.seconds, "wall_s": wall, "cpu_s": cpu, "words": len(st.words)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100, help="small size N (the large one is factor x N)")
    ap.add_argument("--factor", type=int, default=10)
    ap.add_argument("--encoder", default="all-minilm-l6-v2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--dtype", default=None, help="encoder.dtype (default float32; bfloat16 with --llama)")
    ap.add_argument("--two-pass", action="store_true", help="the two-pass reference (data.one_pass=false)")
    ap.add_argument("--llama", default=None, metavar="HIDDEN,LAYERS,INTERMEDIATE,VOCAB",
                    help="a random Llama of this shape saved in bf16 under --save-dir; N sentences, bf16 vs float32 "
                         "(--device cuda: the --dtype row only, default bf16)")
    ap.add_argument("--save-dir", default="/tmp/outlierlab-random-llama")
    ap.add_argument("--max-length", type=int, default=None)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cpu: peak RSS (default); cuda: peak GPU memory and tokens/s on the first GPU")
    ap.add_argument("--evaluate", action="store_true",
                    help="with --llama: the whole evaluate.py (default analyses) in bf16, N sentences")
    ap.add_argument("--wic-pairs", type=int, default=200, help="--evaluate: wic.max_pairs")
    ap.add_argument("--repeat", type=int, default=1,
                    help="--evaluate: run evaluate.py and the bare forward this many times each (alternated) and "
                         "report the medians — one run's peak moves by up to ±0.08x with where glibc places buffers")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    cuda = a.device == "cuda"
    refusal = no_cuda_message() if cuda else None
    if refusal:
        sys.exit(refusal)  # one line, before a 13 GB model is built for nothing
    if a.child is not None:
        measure = child_cuda if cuda else child
        print(json.dumps(measure(a.child, a.encoder, a.batch_size, a.dtype or ("bfloat16" if cuda else "float32"),
                                 not a.two_pass, a.max_length)))
        return

    def run(n: int, encoder: str, dtype: str, two_pass: bool) -> dict:
        cmd = [sys.executable, __file__, "--child", str(n), "--encoder", encoder, "--batch-size", str(a.batch_size),
               "--dtype", dtype] + (["--two-pass"] if two_pass else []) + \
              (["--max-length", str(a.max_length)] if a.max_length else []) + (["--device", "cuda"] if cuda else [])
        r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
        if cuda:
            print(gpu_line(r), flush=True)
            return r
        print(f"N={r['n']:>6} {r['dtype']:>8} {'1 pass ' if r['one_pass'] else '2 passes'}: peak RSS "
              f"{r['peak_rss_mb']:.0f} MiB (imports {r['imports_rss_mb']:.0f}, model loaded {r['baseline_rss_mb']:.0f}, "
              f"+{r['growth_mb']:.0f} during the pass; checkpoint {r['checkpoint_mb']:.0f} MiB -> (peak - imports) / "
              f"checkpoint = {r['peak_over_checkpoint']}), one layer {r['layer_bytes_per_token']:.0f} B/token "
              f"({r['layer_max_bytes'] / 2**20:.1f} MiB at most), {r['tokens']} tokens, "
              f"{r['encode_tokens_per_s']:.0f} tokens/s, wall {r['wall_s']} s", flush=True)
        return r

    if a.llama and a.evaluate:
        import tempfile

        d = ensure_random_llama(a.llama, Path(a.save_dir))
        dtype = a.dtype or "bfloat16"
        runs, bares = [], []
        with tempfile.TemporaryDirectory() as out:
            loaded = evaluate_run(str(d), a.n, a.wic_pairs, dtype, out, load_only=True)
            for _ in range(max(1, a.repeat)):  # alternated, so a drift of the machine falls on both
                runs.append(evaluate_run(str(d), a.n, a.wic_pairs, dtype, out, batch_size=a.batch_size))
                bares.append(bare_forward_run(str(d), a.n, dtype, a.batch_size))
        ckpt = _dir_size(str(d))
        r = {"n": a.n, "wic_pairs": a.wic_pairs, "dtype": dtype, "batch_size": a.batch_size,
             **median_fields(runs, bares, loaded, ckpt)}
        print(f"evaluate.py, N={a.n} sentences, {a.wic_pairs} WiC pairs, {dtype}, batch {a.batch_size}: peak RSS {r['evaluate_peak_rss_mb']:.0f} "
              f"MiB (imports {r['imports_rss_mb']:.0f}; loading + one forward peaks at "
              f"{r['load_and_forward_peak_mb']:.0f}); checkpoint {r['checkpoint_mb']:.0f} MiB -> (peak - imports) / "
              f"checkpoint = {r['peak_over_checkpoint']} (loading alone {r['load_over_checkpoint']}; a bare HF "
              f"forward over the same sentences at this batch size {r['bare_forward_over_checkpoint']}), wall "
              f"{r['wall_s']} s" + (f"; median of {a.repeat} runs: {r['runs_peak_over_checkpoint']}, bare forward "
                                    f"{r['runs_bare_forward_over_checkpoint']}" if a.repeat > 1 else ""), flush=True)
        print(json.dumps(r))
        return
    if a.llama:
        d = ensure_random_llama(a.llama, Path(a.save_dir), a.device)
        results = ([run(a.n, str(d), a.dtype or "bfloat16", a.two_pass)] if cuda else
                   [run(a.n, str(d), "bfloat16", a.two_pass), run(a.n, str(d), "float32", True)])
        print(json.dumps(results))
        return
    small = run(a.n, a.encoder, a.dtype or "float32", a.two_pass)
    large = run(a.factor * a.n, a.encoder, a.dtype or "float32", a.two_pass)
    if cuda:
        ratio = large["peak_gpu_allocated_mb"] / small["peak_gpu_allocated_mb"]
        growth = (large["growth_gpu_mb"] / small["growth_gpu_mb"]) if small["growth_gpu_mb"] > 0 else float("nan")
        print(f"peak GPU memory ratio {a.factor}N/N = {ratio:.3f}; growth-during-pass ratio = {growth:.2f}")
        print(json.dumps([small, large]))
        return
    ratio = large["peak_rss_mb"] / small["peak_rss_mb"]
    growth = (large["growth_mb"] / small["growth_mb"]) if small["growth_mb"] > 0 else float("nan")
    print(f"peak RSS ratio {a.factor}N/N = {ratio:.3f} (goal <= 1.2); growth-during-pass ratio = {growth:.2f}")


if __name__ == "__main__":
    main()
