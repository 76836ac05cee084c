"""The synthetic order task (data=order_task, experiment=order_task): solved by a scheme whose positions reach
attention, not by one whose positions are zeros; train.py's end-of-run line follows order use (docs/order_use.md)."""

from __future__ import annotations

import logging

import pytest
import torch

from outlierlab.datamodules.order_task import OrderTaskDataModule, make_block
from tests.conftest import compose

# each test trains a model until it solves the order task or visibly fails it: the full suite's, not the fast tier's
pytestmark = pytest.mark.slow

#: The docs' stated budget for this size: rope reaches accuracy 0.99 by step 150 and 1.0 by 200 on one CPU thread.
FAST = ["experiment=order_task", "model.hidden_size=64", "model.intermediate_size=128", "model.num_layers=2",
        "model.num_heads=2", "data.val_blocks=64", "trainer.max_steps=200", "trainer.val_check_interval=200",
        "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "export=false"]


def test_blocks_copy_two_to_the_left_and_mask_exactly_the_copies():
    for seed in range(5):
        b = make_block(torch.Generator().manual_seed(seed), 64, 200, 2, 0.15, mask_id=204)
        ids, labels = b["input_ids"], b["labels"]
        copy = labels != -100
        assert ids[0] == 0 and copy.sum() > 3
        assert (ids[copy] == 204).all() and (ids[~copy] != 204).all()
        for i in copy.nonzero().flatten().tolist():
            assert labels[i] == ids[i - 2] and not copy[i - 2]  # the source is an unmasked symbol
    dm = OrderTaskDataModule(objective="clm", val_blocks=8, batch_size=4)
    batch = next(iter(dm.val_dataloader()))
    copy = batch["labels"] != -100
    assert (batch["input_ids"][copy] == batch["labels"][copy]).all()  # causal: unmasked, predicted as next tokens
    assert len(dm.tokenizer) == 205 and dm.tokenizer.mask_token_id == 204
    assert dm.tokenizer("s3 s7")["input_ids"] == [0, 7, 11, 2]


def _train(tmp_path, *overrides):
    from outlierlab.jobs.training import train

    return train(compose("train", [f"run_dir={tmp_path}", *FAST, *overrides]))


def test_rope_solves_it_and_no_line_is_printed(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="outlierlab.jobs.training"):
        metrics = _train(tmp_path, "pos=rope")
    assert metrics["val/acc"] >= 0.95
    assert metrics["val/order_use"] > 1.0
    assert not [r for r in caplog.records if "does not use token order" in r.getMessage()]


def test_rope_fed_zero_positions_fails_it_and_says_so(tmp_path, caplog, monkeypatch):
    from outlierlab.models import positions

    original = positions.RotaryPositions.forward

    def broken(self, q, k, position_ids):  # the scheme's path with its positions zeroed: no order information
        return original(self, q, k, torch.zeros_like(position_ids))

    monkeypatch.setattr(positions.RotaryPositions, "forward", broken)
    with caplog.at_level(logging.WARNING, logger="outlierlab.jobs.training"):
        metrics = _train(tmp_path, "pos=rope")
    assert metrics["val/acc"] < 0.2
    assert abs(metrics["val/order_use"]) < 0.01  # a masked model without positions: permutation-equivariant
    lines = [r.getMessage() for r in caplog.records if "does not use token order" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("the model does not use token order yet: order use")
