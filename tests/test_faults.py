"""Fault tests: a killed run resumes exactly; no half-written checkpoint is ever left behind."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from tests.run_fixtures import SMALL


def _steps(csv_path: Path) -> list[int]:
    with open(csv_path) as f:
        return sorted({int(r["step"]) for r in csv.DictReader(f)})


def _rows_per_step(csv_path: Path) -> Counter:
    with open(csv_path) as f:
        return Counter(int(r["step"]) for r in csv.DictReader(f))


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume(tmp_path, shared_cache):
    from outlierlab.jobs.training import train
    from tests.run_fixtures import small_cfg

    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "OUTLIERLAB_DEBUG"}
    settings = ["trainer.max_steps=40", "trainer.limit_val_batches=0",
                "callbacks.model_checkpoint.every_n_train_steps=5", "callbacks.layernorm_monitor.every_n_steps=5",
                "callbacks.hidden_state_monitor.every_n_steps=5", "callbacks.hidden_state_monitor.n_sequences=4",
                "callbacks.layernorm_monitor.image_every_n_steps=1000",
                "callbacks.hidden_state_monitor.image_every_n_steps=1000"]
    common = [*SMALL, f"hydra.run.dir={run}", *settings]
    proc = subprocess.Popen([sys.executable, "train.py", *common], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt10 = run / "checkpoints" / "step0000010.ckpt"
    deadline = time.time() + 400
    while not ckpt10.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert ckpt10.exists(), "training never reached step 10"
    # kill at once: on an idle machine the small model runs the remaining 30 steps in a second or two
    time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    # every checkpoint file left behind is complete and loadable
    for ckpt in (run / "checkpoints").glob("*.ckpt"):
        torch.load(ckpt, map_location="cpu", weights_only=False)
    killed_at = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    assert 10 <= killed_at < 40

    # the same command with ckpt_path=last, in this process: the kill above is what needs a process of its own, and
    # a second train.py would spend most of its time importing torch and Lightning again
    train(small_cfg(run, *settings, "ckpt_path=last"))
    final = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert final["global_step"] == 40
    state = final["optimizer_states"][0]["state"]
    assert all(int(s["step"]) == 40 for s in state.values())  # Adam saw exactly 40 updates
    # monitor history: every recorded step once, no gap in the 5-step grid, nothing after the kill duplicated
    for name in ("layernorm.csv", "hidden_states.csv"):
        steps = _steps(run / "monitor" / name)
        assert steps[:9] == [0, 5, 10, 15, 20, 25, 30, 35, 39] or set(range(0, 40, 5)) <= set(steps), steps
        counts = _rows_per_step(run / "monitor" / name)
        assert len({counts[s] for s in range(5, 40, 5)}) == 1, counts  # same number of rows for each step
    # metrics.csv: train/loss for every step exactly once
    with open(run / "csv" / "metrics.csv") as f:
        loss_steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert sorted(loss_steps) == list(range(40))


@pytest.mark.slow
def test_a_kill_between_a_checkpoint_and_the_row_before_it_loses_no_row(tmp_path, shared_cache):
    """Lightning saves step S's checkpoint (a callback's on_train_batch_end) before its loop logs the training row of
    step S - 1, and a resume from S never relogs that row: a SIGKILL between the two would lose it for good.  Here a
    finished run's metrics.csv is cut as such a kill leaves it (the row of step 2 missing, step 3's checkpoint
    written), and the resume from step 3 must give back the same losses, every step once."""
    from outlierlab.jobs.training import train
    from tests.run_fixtures import CELL, small_cfg, train_losses

    run = tmp_path / "run"
    train(small_cfg(run, *CELL))
    before = train_losses(run)
    assert sorted(before) == list(range(6))
    metrics = run / "csv" / "metrics.csv"
    with open(metrics, newline="") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames, [r for r in reader if int(r["step"]) < 2]
    with open(metrics, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)

    train(small_cfg(run, *CELL, f"ckpt_path={run / 'checkpoints' / 'step0000003.ckpt'}"))
    assert train_losses(run) == before
    assert sorted(_steps_with_loss(metrics)) == list(range(6))


def _steps_with_loss(csv_path: Path) -> list[int]:
    with open(csv_path) as f:
        return [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]


def test_unwritable_run_dir_fails_at_start(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    env = {k: v for k, v in os.environ.items() if k != "OUTLIERLAB_DEBUG"}
    r = subprocess.run([sys.executable, "train.py", f"hydra.run.dir={blocker}/run"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: run directory {blocker}/run is not writable (Not a directory); choose another with hydra.run.dir="


@pytest.mark.slow
def test_sigterm_to_the_whole_group_with_loader_workers_saves_last_ckpt(tmp_path, shared_cache):
    """A scheduler's preemption (SLURM signals every process of the job) reaches the DataLoader workers too, which
    ``data.num_workers=auto`` starts on a GPU.  The training process must still save ``last.ckpt`` at the step in
    flight and exit 143; a worker dying of the signal made it fail with "DataLoader worker is killed by signal"
    (exit 1) and save nothing."""
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "OUTLIERLAB_DEBUG"}
    common = [*SMALL, f"hydra.run.dir={run}", "trainer.max_steps=400", "trainer.limit_val_batches=0",
              "data.num_workers=2", "callbacks.model_checkpoint.every_n_train_steps=1000", "posthoc=false",
              "export=false"]
    proc = subprocess.Popen([sys.executable, "train.py", *common], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    history = run / "monitor" / "hidden_states.csv"  # its step-0 record: training has started, workers too
    deadline = time.time() + 400
    while not history.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert history.exists(), "training never started"
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)  # the whole group: the training process and its two workers
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-2000:]
    assert "DataLoader worker" not in err
    stopped_at = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    assert 0 < stopped_at < 400
