"""scripts/gpu_scale.sh, dry-run: every train.py command it would run on a GPU machine parses with Hydra's own
override parser and composes (a GPU call once died on an unquoted '=' in a run directory), every other command names
a file or module that exists; and the GPU benchmark runs end to end on this CPU (--tiny; no speed is asserted)."""

from __future__ import annotations

import csv
import math
import os
import shlex
import subprocess

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from outlierlab.configuration.overrides import check_overrides
from tests.conftest import ROOT, compose


def dry_run(modes: str, out, **env) -> list[list[str]]:
    done = subprocess.run(["bash", "scripts/gpu_scale.sh", modes, "300"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DRY_RUN": "1", "OUT": str(out), **env}, timeout=60)
    assert done.returncode == 0, done.stderr
    return [shlex.split(line[2:]) for line in done.stdout.splitlines() if line.startswith("+ ")]


def _first_of_each_sweep(overrides: list[str]) -> list[str]:
    """The first cell of a multirun: each sweep override at its first value, as Hydra's parser reads it."""
    out = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            out.append(f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}")
        else:
            out.append(o.input_line)
    return out


@pytest.mark.parametrize("env", [{}, {"LADDER_POS": "learned,none,rope", "LADDER_SEEDS": "1 2",
                                     "LADDER_OPTIMIZERS": "adamw,muon,sgd"}])
@pytest.mark.slow
def test_every_command_of_the_script_parses_and_composes(env, tmp_path):
    commands = dry_run("pack,smoke,bench,determinism,ladder", tmp_path / "gpu_out", **env)
    trains = [c for c in commands if c[:2] == ["python", "train.py"]]
    assert len(trains) == 7  # a smoke cell per rung, two deterministic replicates, then the ladder sweep
    replicates = trains[4:6]
    assert all("trainer.deterministic=true" in c and "seed=3" in c and "pos=learned" in c for c in replicates)
    assert [a for a in replicates[0] if not a.startswith("hydra.run.dir")] == \
        [a for a in replicates[1] if not a.startswith("hydra.run.dir")]  # the same cell twice
    for cmd in trains:
        check_overrides(["train.py", *cmd[2:]], config_name="train")  # train.py's own first check, sweeps included
        overrides = [a for a in cmd[2:] if a != "-m"]
        overrides = [o for o in _first_of_each_sweep(overrides) if not o.startswith(("hydra/launcher", "hydra."))]
        cfg = compose("train", [f"run_dir={tmp_path}", *overrides])
        assert cfg.data.files == [".gpu_data/english_large"] and cfg.trainer.accelerator == "gpu"
        assert cfg.trainer.deterministic == ("trainer.deterministic=true" in cmd)
    sweep = trains[-1]
    n_jobs = next(a for a in sweep if a.startswith("hydra.launcher.n_jobs="))
    cells = 4 * (3 if env else 2) * (2 if env else 1) * (3 if env else 1)
    assert n_jobs == f"hydra.launcher.n_jobs={cells}" and "+trainer.max_time=00:00:05:00" in sweep
    for cmd in commands:
        if cmd[0] == "python" and cmd[1].endswith(".py"):
            assert (ROOT / cmd[1]).is_file(), cmd
        elif cmd[:2] == ["python", "-m"]:
            assert (ROOT / (cmd[2].replace(".", "/") + ".py")).is_file(), cmd


def test_an_unknown_mode_is_refused():
    done = subprocess.run(["bash", "scripts/gpu_scale.sh", "warp"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DRY_RUN": "1"}, timeout=60)
    assert done.returncode == 2 and "unknown mode warp (pack, first, smoke, bench, determinism, ladder)" in done.stderr


def test_the_short_loan_mode_brings_the_headline_rows_first(tmp_path):
    """``first``: three benchmark calls of RoBERTa-base at block 128, ours against HF's Trainer -- compiled first
    (the comparison as a user runs both), then plain and deterministic (the determinism switch's cost) -- and no
    training run, so one call of a 15-minute loan holds it."""
    commands = dry_run("first", tmp_path / "gpu_out")
    assert [c[1] for c in commands] == ["benchmarks/gpu_throughput.py"] * 3
    for c in commands:
        assert c[c.index("--model") + 1] == "base" and c[c.index("--block") + 1] == "128"
        assert c[c.index("--impl") + 1] == "ours,hf"
    assert ["--compile" in c for c in commands] == [True, False, False]
    assert ["--deterministic" in c for c in commands] == [False, False, True]


def test_the_gpu_benchmark_runs_end_to_end_on_cpu(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_throughput", ROOT / "benchmarks" / "gpu_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "throughput.csv"
    rows = bench.main(["--tiny", "--out", str(out), "--tmp", str(tmp_path)])
    assert [r["impl"] for r in rows] == ["ours", "hf"]
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["tokens_per_step"] == 8 * 32 and math.isnan(r["mfu"])  # no CPU peak
    bench.main(["--tiny", "--impl", "ours", "--out", str(out), "--tmp", str(tmp_path)])
    bench.main(["--tiny", "--impl", "ours", "--deterministic", "--out", str(out), "--tmp", str(tmp_path)])
    written = list(csv.DictReader(open(out)))
    assert [r["impl"] for r in written] == ["ours", "hf", "ours", "ours"]  # one header, rows appended
    assert [r["deterministic"] for r in written] == ["False", "False", "False", "True"]
    assert list(written[0]) == bench.COLUMNS and written[0]["command"].startswith("python benchmarks/gpu_throughput.py")
    import torch

    assert not torch.are_deterministic_algorithms_enabled()  # switched off again after the deterministic row
