"""TensorBoard after resume shows each step once, read back with TensorBoard's own reader."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from conftest import compose
from outlierlab.lightning_modules.loggers import write_purge_marker

FAST = ["trainer.log_every_n_steps=1", "trainer.val_check_interval=5", "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "export=false",
        "model.num_layers=1", "model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=128",
        "callbacks.model_checkpoint.every_n_train_steps=10", "callbacks.layernorm_monitor.every_n_steps=5",
        "callbacks.hidden_state_monitor.every_n_steps=5", "callbacks.hidden_state_monitor.n_sequences=4",
        "callbacks.hidden_state_monitor.n_pairs=50", "data.limit_blocks=400",
        "callbacks.throughput.window_size=2"]  # a resumed session has its own window: 2 steps, so both log


def scalar_steps(run_dir: Path) -> dict[str, list[int]]:
    """Every scalar tag's steps as TensorBoard shows them (it applies restart markers while reading)."""
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def train_run(run_dir: Path, max_steps: int, ckpt_path: str | None = None) -> None:
    from outlierlab.jobs.training import train

    train(compose("train", [f"run_dir={run_dir}", f"trainer.max_steps={max_steps}", *FAST,
                            *([f"ckpt_path={ckpt_path}"] if ckpt_path else [])]))


def test_marker_purges_only_the_abandoned_steps(tmp_path):
    """Unit level, no training: without the marker the redone steps show twice."""
    for purge in (False, True):
        d = tmp_path / str(purge) / "tensorboard"
        w = SummaryWriter(str(d))
        for s in range(1, 15):
            w.add_scalar("loss", float(s), s)
        w.close()
        # TensorBoard reads a directory's event files in name order. Both writers open in the same second, so
        # their names differ only in a per-process counter, which sorts as text (...9 after ...10.resumed): name
        # the first session's file by an earlier second, as a session that ran before the resumed one has.
        (first,) = d.glob("events.out.tfevents.*")
        first.rename(d / first.name.replace("events.out.tfevents.", "events.out.tfevents.0000000001.", 1))
        w = SummaryWriter(str(d), filename_suffix=".resumed")
        if purge:
            write_purge_marker(w, 11)
        for s in range(11, 21):
            w.add_scalar("loss", 100.0 + s, s)
        w.close()
        steps = scalar_steps(d.parent)["loss"]
        if purge:
            assert steps == list(range(1, 21))
            acc = EventAccumulator(str(d)); acc.Reload()
            assert [e.value for e in acc.Scalars("loss")][9:11] == [10.0, 111.0]  # new timeline from step 11
        else:
            assert Counter(steps)[11] == 2  # the bug this guards against


@pytest.mark.slow
def test_resume_from_10_to_20_shows_each_step_once(tmp_path, shared_cache):
    # Uninterrupted reference: 20 steps.
    train_run(tmp_path / "straight", 20)
    reference = scalar_steps(tmp_path / "straight")
    # Interrupted: the run gets to step 14 (checkpoint at 10), then resumes from the step-10 checkpoint to 20,
    # redoing steps 11-14 whose events the first session already wrote.
    run = tmp_path / "resumed"
    train_run(run, 14)
    ckpt = next((run / "checkpoints").glob("step0000010.ckpt"))
    kept = tmp_path / "step10.ckpt"
    shutil.copy(ckpt, kept)
    train_run(run, 20, ckpt_path=str(kept))
    resumed = scalar_steps(run)
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2  # both sessions' files read
    assert resumed.keys() == reference.keys()
    for tag, steps in resumed.items():
        # as often as in the uninterrupted run (Lightning logs `epoch` with both train and val metrics: twice)
        extra = Counter(steps) - Counter(reference[tag])
        assert not extra, f"{tag}: steps shown more often than without the interruption: {sorted(extra)}"
        if tag.startswith("train/device/"):
            # ThroughputMonitor measures a rate between two steps: a new session's first step has none
            assert sorted((Counter(reference[tag]) - Counter(steps)).elements()) == [10], tag
        else:
            assert steps == reference[tag], f"{tag}: {steps} vs uninterrupted {reference[tag]}"
    assert max(resumed["train/loss"]) == 19 and Counter(resumed["train/loss"])[11] == 1  # 0-based: step 20 logs 19
