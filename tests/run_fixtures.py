"""Shared helpers of the tests that train, resume and run the entry scripts: a small training configuration, what a
run directory holds afterwards, a run directory planted by hand, and the entry scripts run as a user runs them."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from outlierlab.jobs.run_state import mark_finished, record_start
from tests.conftest import ROOT, compose

SMALL = [
    "data.max_documents=400",
    "data.val_blocks=4",
    "data.batch_size=8",
    "data.block_size=64",
    "tokenizer.vocab_size=1000",
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.intermediate_size=128",
    "model.max_len=64",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
]


def small_cfg(run_dir: Path, *overrides: str):
    return compose("train", [f"run_dir={run_dir}", *SMALL, *overrides])


def train_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


CELL = [*SMALL, "trainer.limit_val_batches=0", "export=false", "callbacks.model_checkpoint.every_n_train_steps=3",
        "trainer.max_steps=6"]


METRICS_CSV = "step,train/loss,val/ppl\n0,6.9,\n10,5.1,\n20,4.2,329.7\n"


MONITOR_CSV = "step,name,statistic,dim,value\n0,layer_0,mean,,0.78697\n10,layer_0,mean,,0.5\n"


def make_cell(root: Path, steps: int = 20, max_steps: int = 20) -> Path:
    """A hand-made finished training cell: two CSVs, a config, a checkpoint, an event file and HF weights."""
    (root / "csv").mkdir(parents=True)
    (root / "monitor").mkdir()
    (root / "checkpoints").mkdir()
    (root / "tensorboard").mkdir()
    (root / "hf").mkdir()
    (root / ".hydra").mkdir()
    (root / "csv" / "metrics.csv").write_text(METRICS_CSV)
    (root / "monitor" / "hidden_states.csv").write_text(MONITOR_CSV)
    (root / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (root / "config.yaml").write_text("seed: 1\n")
    (root / "checkpoints" / "last.ckpt").write_bytes(b"\0" * 64)
    (root / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"ev")
    (root / "hf" / "model.safetensors").write_bytes(b"w" * 32)
    (root / "hf" / "config.json").write_text("{}")
    record_start(root, 0)
    mark_finished(root, steps, max_steps, {"val/ppl": 329.7}, {"seed": 1})
    return root


def cli(script: str, args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for key in ("OUTLIERLAB_DEBUG", "HYDRA_FULL_ERROR", "SLURM_JOB_ID"):
        env.pop(key, None)
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env)


def one_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr and "HYDRA_FULL_ERROR" not in stderr, stderr[-2000:]
    return errors[0]


def run_without_outlierlab(script: str, tmp: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``script`` in a Python where ``import outlierlab`` raises ImportError, from a directory outside the
    repository, offline, with transformers' remote-code module cache under ``tmp``."""
    shim = tmp / "no_outlierlab"
    shim.mkdir(exist_ok=True)
    (shim / "outlierlab.py").write_text('raise ImportError("outlierlab is blocked: transformers alone must do")\n')
    (tmp / "check.py").write_text(textwrap.dedent(script))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=str(shim), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               HF_MODULES_CACHE=str(tmp / "hf_modules"), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, str(tmp / "check.py")], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=timeout)
