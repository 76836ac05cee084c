"""pos.init / pos.init_scale of the learned table (the order-use recipe sweep's candidates, docs/order_use.md)."""

from __future__ import annotations

import math

import pytest
import torch

from outlierlab.models import EncoderConfig, RobertaMaskedLM
from outlierlab.models.positions import sinusoidal_table


def _table(**pos):
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=30, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=64, max_len=40,
                        pos={"name": "learned", **pos})
    return cfg, RobertaMaskedLM(cfg).roberta.embeddings.position_embeddings.weight.detach()


def test_defaults_are_not_recorded_and_draw_what_they_drew_before():
    cfg, table = _table(init="normal", init_scale=1.0)
    assert cfg.pos == {"name": "learned"}  # old checkpoints and exports name the same model
    _, plain = _table()
    assert torch.equal(table, plain)
    assert table[1].abs().sum() == 0 and table[2:].std().item() == pytest.approx(0.02, rel=0.1)


def test_scale_and_sinusoidal_start():
    cfg, wide = _table(init_scale=10.0)
    assert cfg.pos == {"name": "learned", "init_scale": 10.0}
    assert wide[2:].std().item() == pytest.approx(0.2, rel=0.1)
    _, sin = _table(init="sinusoidal", init_scale=2.0)
    rows = sin.shape[0] - 2  # padding_idx 1: rows 0 and 1 precede position 0
    expected = sinusoidal_table(rows, 64) * 0.02 * math.sqrt(2) * 2.0
    assert torch.allclose(sin[2:], expected) and sin[:2].abs().sum() == 0
    with pytest.raises(ValueError, match="pos.init='uniform'"):
        _table(init="uniform")
