"""benchmarks/evaluate_memory.py without running a benchmark: its refusals and the arithmetic of its report."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "evaluate_memory.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("evaluate_memory_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_save_dir_holding_another_shape_is_refused_in_one_line(bench, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 1024, "num_hidden_layers": 8, "intermediate_size": 2816, "vocab_size": 32000}))
    bench.check_saved_shape(tmp_path, "1024,8,2816,32000")  # the same shape: reused
    with pytest.raises(SystemExit) as e:
        bench.check_saved_shape(tmp_path, "4096,32,11008,32000")
    msg = str(e.value.code)
    assert "\n" not in msg and "1024,8,2816,32000" in msg and "--llama 4096,32,11008,32000" in msg


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused_before_anything_is_built(bench, tmp_path):
    """The random Llama carries the bundled 30,522-id tokenizer: a smaller vocab failed as an IndexError deep in
    the evaluate.py child."""
    with pytest.raises(SystemExit) as e:
        bench.ensure_random_llama("256,2,512,1000", tmp_path / "llama")
    msg = str(e.value.code)
    assert "\n" not in msg and "30522" in msg and "--llama 256,2,512,1000" in msg
    assert not (tmp_path / "llama").exists()


def test_device_cuda_without_a_gpu_is_one_line_and_builds_nothing(tmp_path):
    """No traceback, exit != 0, and it exits before --llama builds (and saves) a model."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine with one
    save = tmp_path / "llama"
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda", "--llama", "64,1,128,32000", "--save-dir",
                        str(save)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--device cuda needs a CUDA GPU" in lines[0] and "run without --device" in lines[0]
    assert not save.exists() and not r.stdout.strip()


def _raw(**over) -> dict:
    mib = 2**20
    raw = {"n": 16, "dtype": "bfloat16", "one_pass": True, "gpu": "NVIDIA H100 80GB HBM3",
           "weights_bytes": 12_000 * mib, "load_peak_bytes": 12_500 * mib, "pass_peak_allocated_bytes": 15_000 * mib,
           "pass_peak_reserved_bytes": 16_000 * mib, "checkpoint_bytes": 10_000 * mib, "peak_rss_kib": 3 * 1024 * 1024,
           "layer_max_bytes": 64 * mib, "layer_bytes_per_token": 8192.0, "layers": 33, "hidden": 4096,
           "tokens": 9000, "passes": 1, "encode_s": 3.0, "wall_s": 4.5, "cpu_s": 4.0, "words": 400}
    return {**raw, **over}


def test_gpu_fields_arithmetic(bench):
    r = bench.gpu_fields(_raw())
    assert r["device"] == "cuda" and r["gpu"] == "NVIDIA H100 80GB HBM3"
    assert (r["weights_gpu_mb"], r["load_peak_gpu_mb"], r["peak_gpu_allocated_mb"], r["peak_gpu_reserved_mb"]) == \
        (12_000.0, 12_500.0, 15_000.0, 16_000.0)
    assert r["growth_gpu_mb"] == 3_000.0 and r["checkpoint_mb"] == 10_000.0  # the pass on top of the weights
    assert r["weights_over_checkpoint"] == 1.2 and r["peak_over_checkpoint"] == 1.5
    assert r["reserved_over_checkpoint"] == 1.6 and r["growth_over_weights"] == 0.25
    assert r["encode_tokens_per_s"] == 3000.0 and r["tokens_per_s"] == 2000.0  # encoding alone / with statistics
    assert r["peak_rss_mb"] == 3072.0 and r["layer_bytes_per_token"] == 8192.0 and r["layers"] == 33
    json.dumps(r)  # the benchmark prints it
    line = bench.gpu_line(r)
    assert "\n" not in line and "peak / checkpoint = 1.5" in line and "+3000 over the weights" in line
    assert "2000.0 tokens/s with the statistics" in line
    # nothing to divide by: no ratio, not a ZeroDivisionError
    z = bench.gpu_fields(_raw(checkpoint_bytes=0, weights_bytes=0, encode_s=0.0, wall_s=0.0))
    assert {z[k] for k in ("peak_over_checkpoint", "growth_over_weights", "tokens_per_s", "encode_tokens_per_s")} \
        == {None}
    bench.gpu_line(z)


def test_repeated_evaluate_runs_report_the_median_run_and_every_ratio(bench):
    """--evaluate --repeat: the median run's fields (by peak), every run's ratio in run order, the bare forward's
    median; ratios are (peak - imports) / checkpoint with ru_maxrss in KiB and the checkpoint in bytes."""
    mib = 1024
    loaded = {"imports_kib": 500 * mib, "peak_kib": 2_500 * mib}
    runs = [{"peak_kib": p * mib, "wall_s": w} for p, w in ((3_500, 10.0), (3_300, 11.0), (3_400, 12.0))]
    bares = [{"peak_kib": p * mib, "imports_kib": 500 * mib} for p in (3_100, 2_900, 3_000)]
    r = bench.median_fields(runs, bares, loaded, 2_000 * 2**20)
    assert r["runs_peak_over_checkpoint"] == [1.5, 1.4, 1.45]  # (3500-500)/2000, ...
    assert r["evaluate_peak_rss_mb"] == 3_400.0 and r["peak_over_checkpoint"] == 1.45 and r["wall_s"] == 12.0
    assert r["runs_bare_forward_over_checkpoint"] == [1.2, 1.25, 1.3] and r["bare_forward_over_checkpoint"] == 1.25
    assert r["bare_forward_peak_mb"] == 3_000.0 and r["imports_rss_mb"] == 500.0
    one = bench.median_fields(runs[:1], bares[:1], loaded, 2_000 * 2**20)  # --repeat 1: that run, as before
    assert one["peak_over_checkpoint"] == 1.5 and one["bare_forward_over_checkpoint"] == 1.3


def test_cuda_child_loads_through_evaluates_encoder_config(bench, monkeypatch):
    """child_cuda end to end with the CUDA calls faked and the model on the CPU: the encoder gets evaluate's
    config section with device=cuda and the dtype, and the pass's numbers reach the fields."""
    import torch

    real = bench.FrozenEncoder
    seen = {}

    class OnCpu(real):
        @classmethod
        def from_config(cls, node):
            seen.update(device=node.device, dtype=node.dtype, max_length=node.max_length, device_map=node.device_map,
                        on_overflow=node.on_overflow)
            node.device = "cpu"  # (no GPU here)
            return real.from_config(node)

    mib = 2**20
    calls = {"allocated": iter([100 * mib]), "max_allocated": iter([150 * mib, 180 * mib])}
    monkeypatch.setattr(bench, "FrozenEncoder", OnCpu)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: next(calls["allocated"]))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: next(calls["max_allocated"]))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a, **k: 200 * mib)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "fake GPU")
    r = bench.child_cuda(40, "all-minilm-l6-v2", 4, "float32", True, 64)  # (bf16 matmuls: 20x slower on CPU)
    assert seen == {"device": "cuda", "dtype": "float32", "max_length": 64, "device_map": None, "on_overflow": "warn"}
    assert r["weights_gpu_mb"] == 100.0 and r["load_peak_gpu_mb"] == 150.0 and r["peak_gpu_allocated_mb"] == 180.0
    assert r["growth_gpu_mb"] == 80.0 and r["peak_gpu_reserved_mb"] == 200.0 and r["gpu"] == "fake GPU"
    assert r["layers"] == 7 and r["hidden"] == 384 and r["tokens"] > 0 and r["tokens_per_s"] > 0
    assert r["layer_bytes_per_token"] == 384 * 4 and r["dtype"] == "float32"  # one layer handed over
    assert r["checkpoint_mb"] > 0 and r["peak_over_checkpoint"] is not None  # MiniLM's safetensors
