"""Configuration of the RoBERTa encoder (Liu et al. 2019) with a pluggable position scheme.

A plain dataclass so that Hydra can build it with ``_target_`` and it can be saved
as JSON next to the weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EncoderConfig:
    """Architecture of a post-LayerNorm RoBERTa encoder.

    Parameters
    ----------
    vocab_size : int
        Size of the token vocabulary (set from the tokenizer at run time).
    hidden_size, num_layers, num_heads, intermediate_size : int
        Transformer dimensions (paper Table 4, RoBERTa-base: 768, 12, 12, 3072).
    dropout, attention_dropout : float
        Dropout on hidden states and on attention probabilities.
    max_len : int
        Longest sequence the model accepts, in tokens including ``<s>`` and ``</s>``.
        Learned positions follow RoBERTa and allocate ``max_len + 2`` rows because
        position ids start after ``pad_token_id``.
    pos : dict
        Position scheme: ``{"name": <registered scheme>, **options}``; see
        :mod:`models.positions`.
    """

    vocab_size: int = 8192
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.1
    max_len: int = 128
    pos: dict[str, Any] = field(default_factory=lambda: {"name": "learned"})
    pad_token_id: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 2
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        # Hydra hands over DictConfig objects; keep a plain dict so the config is JSON-able.
        self.pos = dict(self.pos) if self.pos is not None else {"name": "none"}
        if "name" not in self.pos:
            raise ValueError("pos must name a position scheme, e.g. pos={name: learned}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}"
            )
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2 (got {self.max_len})")

    @property
    def pos_name(self) -> str:
        return str(self.pos["name"])

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_position_embeddings(self) -> int:
        """Rows of an absolute position table in the RoBERTa convention (max_len + pad + 1)."""
        return self.max_len + self.pad_token_id + 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EncoderConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown EncoderConfig keys: {sorted(unknown)}")
        return cls(**d)
