"""Configuration of the RoBERTa encoder (Liu et al. 2019) with a pluggable position scheme and architecture switches
against outlier features (see docs/architectures.md).

A plain dataclass, built by Hydra with ``_target_`` and saved as JSON next to the weights.  The defaults are
post-LayerNorm RoBERTa, so a config saved without the switches loads into the same model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

#: Valid values of each architecture switch; the first is the default (plain RoBERTa).
SWITCH_CHOICES: dict[str, tuple[str, ...]] = {
    "norm_placement": ("post", "pre"), "norm": ("layernorm", "layernorm_noaffine", "rmsnorm"),
    "attention": ("softmax", "clipped_softmax", "gated"), "block": ("roberta", "op"),
    "gate": ("linear", "mlp", "all_heads_linear")}


#: Position-scheme options whose default value is not recorded in ``EncoderConfig.pos``.
POS_OPTION_DEFAULTS = {"init": "normal", "init_scale": 1.0}


@dataclass
class EncoderConfig:
    """Architecture of a post-LayerNorm RoBERTa encoder.

    vocab_size : token vocabulary (set from the tokenizer at run time).
    hidden_size, num_layers, num_heads, intermediate_size : paper Table 4, RoBERTa-base: 768, 12, 12, 3072.
    dropout, attention_dropout : on hidden states and on attention probabilities.
    max_len : longest sequence in tokens, ``<s>`` and ``</s>`` included (learned positions allocate ``max_len + 2``
        rows, RoBERTa's ids starting after ``pad_token_id``).
    pos : ``{"name": <registered scheme>, **options}`` (``outlierlab.models.positions``).
    norm_placement, norm, attention, block : the switches (docs/architectures.md gives each with its paper's values):
        ``post`` (``x = LN(x + f(x))``) or ``pre`` (``x = x + f(LN(x))`` and a final LayerNorm; Xiong et al. 2020);
        ``layernorm``, ``layernorm_noaffine`` or ``rmsnorm`` for the body (the MLM head keeps RoBERTa's LayerNorm);
        ``softmax``, ``clipped_softmax`` (``clip((ζ-γ)·softmax + γ, 0, 1)``) or ``gated`` (each head's output times a
        sigmoid gate of the token's input; Bondarenko et al. 2023); ``roberta`` or ``op``, the Outlier-Protected block
        of He et al. (2024).
    clip_gamma, clip_zeta : γ ≤ 0 and ζ ≥ 1 (Bondarenko et al.: γ = -0.025, ζ = 1 at T = 128 for BERT; γ = -α/T).
    gate, gate_hidden, gate_bias_init : ``mlp`` (per head, their BERT recipe, the default), ``linear`` (their OPT
        recipe) or ``all_heads_linear``; the ``mlp`` gate's width (None: ``head_dim // 4``); the initial gate is
        ``sigmoid(gate_bias_init)`` (their π_init).
    op_beta : the β of the OP block's ``x + β·f(x)``; None: He et al.'s ``0.2·√(12/num_layers)``.
    causal : each token attends to itself and earlier tokens only: the decoder of ``objective=clm`` (Radford et al.
        2019; Haviv et al. 2022), same blocks and switches; docs/architectures.md.
    op_beta_trainable : learn β per branch and layer (off, as He et al.: a learned β can undo the down-scaling).
    vocab_multiple : round the embedding rows (and tied head columns) up to a multiple of this (RoBERTa's 50,265 ->
        50,304 at 64) for GPU-friendly shapes.  Exact: padded logits are -inf, so loss and gradients equal the unpadded
        model's, and returned ``logits`` and exports cover the real vocabulary.  1: none.
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
    norm_placement: str = "post"
    norm: str = "layernorm"
    attention: str = "softmax"
    block: str = "roberta"
    clip_gamma: float = -0.025
    clip_zeta: float = 1.0
    gate: str = "mlp"
    gate_hidden: int | None = None
    gate_bias_init: float = 0.0
    op_beta: float | None = None
    op_beta_trainable: bool = False
    causal: bool = False
    vocab_multiple: int = 1

    def __post_init__(self) -> None:
        # Hydra passes an override's value with the type it parsed (model.vocab_multiple=abc is a str), and a
        # dataclass does not check it: refuse it here, naming the key, before a comparison below fails on it
        # with a TypeError that does not.
        for f in dataclasses.fields(self):
            kind, value = f.type.removesuffix(" | None"), getattr(self, f.name)
            if kind == "bool" and not isinstance(value, bool):  # model.causal=no is the string 'no': true
                raise ValueError(f"model.{f.name} must be true or false, got {value!r}")
            if kind not in ("int", "float") or (value is None and f.type.endswith(" | None")):
                continue
            if isinstance(value, bool) or not isinstance(value, int if kind == "int" else (int, float)):
                raise ValueError(f"model.{f.name} must be {'an integer' if kind == 'int' else 'a number'}, "
                                 f"got {value!r}")
        # Hydra hands over DictConfig objects; keep a plain dict so the config is JSON-able.
        self.pos = dict(self.pos) if self.pos is not None else {"name": "none"}
        if "name" not in self.pos:
            raise ValueError("pos must name a position scheme, e.g. pos={name: learned}")
        # Options at their defaults are left out (pos.init=normal, pos.init_scale=1 of the learned table): the
        # canonical pos dict of a plain learned model stays {"name": "learned"}, as checkpoints, exports and study
        # cells made before these options recorded it -- so they resume and compare as the same model.
        for key, default in POS_OPTION_DEFAULTS.items():
            if key in self.pos and self.pos[key] == default:
                del self.pos[key]
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2 (got {self.max_len})")
        for key, valid in SWITCH_CHOICES.items():
            if getattr(self, key) not in valid:
                raise ValueError(f"unknown model.{key} {getattr(self, key)!r}; valid: {', '.join(valid)}")
        if not self.clip_zeta > self.clip_gamma:
            raise ValueError(f"clipped softmax needs clip_zeta > clip_gamma (got zeta={self.clip_zeta}, "
                             f"gamma={self.clip_gamma}); the paper uses gamma <= 0 <= 1 <= zeta")
        if self.block == "op" and self.norm_placement != "post":
            raise ValueError("model.block=op has no normalisation in its blocks, so model.norm_placement=pre "
                             "does not apply; leave norm_placement at its default (post)")
        if self.gate_hidden is not None and self.gate_hidden < 1:
            raise ValueError(f"gate_hidden must be >= 1 (got {self.gate_hidden})")
        if self.vocab_multiple < 1:
            raise ValueError(f"model.vocab_multiple must be >= 1 (1: no padding; 64 on a GPU), "
                             f"got {self.vocab_multiple}")

    @property
    def pos_name(self) -> str:
        return str(self.pos["name"])

    @property
    def is_plain_roberta(self) -> bool:
        """True when every switch is at its default: the body is exactly ``RobertaModel``'s."""
        return all(getattr(self, key) == valid[0] for key, valid in SWITCH_CHOICES.items() if key != "gate")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding: ``vocab_size`` rounded up to a multiple of ``vocab_multiple``."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def gate_width(self) -> int:
        """Hidden width of the ``mlp`` gate: ``gate_hidden``, or ``head_dim // 4`` (Bondarenko et al.'s code)."""
        return int(self.gate_hidden) if self.gate_hidden is not None else max(1, self.head_dim // 4)

    @property
    def op_beta_value(self) -> float:
        """β of the OP block: ``op_beta``, or He et al.'s 0.2 at 12 layers scaled as 1/√depth."""
        return float(self.op_beta) if self.op_beta is not None else 0.2 * math.sqrt(12 / self.num_layers)

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
