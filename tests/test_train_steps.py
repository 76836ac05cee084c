"""One step axis for a training run: a validation after N optimizer updates is logged at step N, as the console and
the monitors count it, in metrics.csv and in TensorBoard; metrics.csv files logged the old way (at N - 1) are read at
the model's step too."""

from __future__ import annotations

import csv
import io

import pandas as pd
import pytest

from outlierlab.utils.tables import model_step, model_steps
from tests.run_fixtures import small_cfg


def _scalars(run_dir, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


@pytest.mark.slow
def test_validations_are_logged_at_the_step_the_monitors_and_the_console_say(tmp_path, shared_cache):
    from outlierlab.jobs.training import train

    train(small_cfg(tmp_path, "trainer.max_steps=20", "trainer.val_check_interval=10", "export=false",
                    "callbacks.hidden_state_monitor.every_n_steps=10", "callbacks.layernorm_monitor.every_n_steps=10"))
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    val = [r for r in rows if r.get("val/loss")]
    assert [int(r["step"]) for r in val] == [10, 20]  # were 9 and 19
    assert all(int(r["global_step"]) == int(r["step"]) for r in val)
    monitor = pd.read_csv(tmp_path / "monitor" / "hidden_states.csv")
    assert {10, 20} <= set(monitor["step"])  # the same points of training, at the same steps
    assert _scalars(tmp_path, "val/loss") == [10, 20] and _scalars(tmp_path, "val/order_use") == [10, 20]
    # a training loss stays at the step of the model that computed it (the 20th update's loss at step 19)
    assert max(int(r["step"]) for r in rows if r.get("train/loss")) == 19


def test_a_metrics_csv_logged_the_old_way_is_read_at_the_model_s_step():
    old = "epoch,step,train/loss,val/loss\n0,98,5.0,\n0,99,4.9,\n0,99,,4.8\n"
    new = "epoch,global_step,step,train/loss,val/loss\n0,,98,5.0,\n0,,99,4.9,\n,100,100,,4.8\n"
    for text in (old, new):
        frame = pd.read_csv(io.StringIO(text))
        assert model_steps(frame).tolist() == [98, 99, 100]
        assert [model_step(r) for r in csv.DictReader(io.StringIO(text))] == [98, 99, 100]
