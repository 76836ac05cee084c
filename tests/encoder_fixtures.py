"""Shared helpers of the encoder tests: a small configuration of our encoder and a padded batch for it."""

from __future__ import annotations

import torch

from outlierlab.models import EncoderConfig

SMALL = dict(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_len=12)


def cfg(**kw) -> EncoderConfig:
    return EncoderConfig(**{**SMALL, "dropout": 0.0, "attention_dropout": 0.0, **kw})


def batch():
    ids = torch.randint(5, 40, (3, 10), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = 0
    ids[1, 7:] = 1  # right padding
    return ids, (ids != 1).long()
