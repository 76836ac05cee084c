"""Epochs over the data, computed before a run starts (outlierlab/datamodules/budget.py), and its report in train()."""
from __future__ import annotations

import logging

import pytest

from outlierlab.datamodules.budget import data_budget


def test_steps_bound_hand_computed():
    # 32 per device x 2 devices x 2 accumulation = 128 blocks per step; 100 steps = 12,800 blocks = 12.8 epochs
    b = data_budget(train_blocks=1000, train_tokens=60_000, batch_size=32, world_size=2, accumulate=2, max_steps=100)
    assert b.blocks_per_step == 128 and b.steps == 100
    assert b.epochs == pytest.approx(12.8)
    assert b.total_tokens == 768_000  # 12.8 x 60,000 real tokens
    assert "12.80 epochs" in b.summary() and "60,000 tokens per epoch" in b.summary()


def test_epochs_bound_follows_lightning_batches_per_epoch():
    # per device ceil(1000/2) = 500 blocks -> ceil(500/32) = 16 batches -> 16 // 2 = 8 optimizer steps per epoch
    b = data_budget(1000, 60_000, batch_size=32, world_size=2, accumulate=2, max_steps=-1, max_epochs=3)
    assert b.steps == 24
    # the first bound reached wins
    assert data_budget(1000, 60_000, 32, 2, 2, max_steps=10, max_epochs=3).steps == 10


def test_unbounded_or_empty_runs_are_refused():
    with pytest.raises(ValueError, match="no end: set trainer.max_steps"):
        data_budget(1000, 1, 32, max_steps=-1, max_epochs=None)
    with pytest.raises(ValueError, match="positive counts"):
        data_budget(0, 0, 32, max_steps=5)


@pytest.mark.slow
def test_train_logs_the_budget_and_warns_in_the_memorisation_regime(tmp_path, shared_cache, caplog):
    from outlierlab.jobs.training import train
    from tests.run_fixtures import small_cfg

    caplog.set_level(logging.INFO, logger="outlierlab.jobs.training")
    train(small_cfg(tmp_path, "trainer.max_steps=2", "trainer.limit_val_batches=0", "export=false",
                    "data_epochs_warning=0.001"))
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "epochs over the data" in r.message]
    warn = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "memorisation" in r.message]
    assert len(info) == 1 and "2 steps x 8 blocks" in info[0]
    assert len(warn) == 1 and "data_epochs_warning=0.001" in warn[0]
    caplog.clear()
    train(small_cfg(tmp_path / "b", "trainer.max_steps=2", "trainer.limit_val_batches=0", "export=false"))
    assert not [r for r in caplog.records if "memorisation" in r.getMessage()]
