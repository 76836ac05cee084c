"""Position schemes as plug-ins behind one registry.

A scheme contributes at most an *input* module added to the token embeddings before the embeddings LayerNorm
(``learned``, ``sinusoidal``; ``module(position_ids, attention_mask)``) and a per-layer *attention* module that may
rotate q/k and/or bias the scaled logits (``relative``, ``rope``, ``alibi``; ``module(q, k, position_ids) -> (q, k,
bias)``, ``q, k`` ``[B, H, T, Dh]``).

``position_ids`` are 0-based among each row's non-padding tokens (``<s>`` = 0); ``learned`` converts them to RoBERTa's
``padding_idx + 1 + position`` so its table loads in ``RobertaModel``.  ``POSITION_SCHEMES`` must match ``configs/pos/``
(a test checks; entry points validate ``pos=`` before importing torch).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from .config import EncoderConfig


# ------------------------------------------------------------------------------------------- input (absolute) schemes
#: ``pos.init`` values of the learned table.
LEARNED_INITS = ("normal", "sinusoidal")


class LearnedPositionEmbedding(nn.Embedding):
    """Learned absolute positions, RoBERTa convention (Liu et al. 2019; Devlin et al. 2019): token ``t`` uses row
    ``padding_idx + 1 + t`` (``max_len + padding_idx + 1`` rows), as transformers'
    ``create_position_ids_from_input_ids``."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config.max_position_embeddings, config.hidden_size, padding_idx=config.pad_token_id)
        self.pad = config.pad_token_id
        self.init = str(config.pos.get("init", "normal"))
        self.init_scale = float(config.pos.get("init_scale", 1.0))
        if self.init not in LEARNED_INITS:
            raise ValueError(f"pos.init={self.init!r}; choose one of {', '.join(LEARNED_INITS)}")
        self.initializer_range = float(config.initializer_range)
        # Not re-initialised here: RobertaMaskedLM._init_weights calls reset_parameters() in module order, so the
        # default init draws exactly the random numbers of the plain N(0, std²) table (seeded runs unchanged).

    def reset_parameters(self) -> None:
        """Initial values (``pos.init``, ``pos.init_scale``): ``normal`` is BERT/RoBERTa's N(0,
        (initializer_range·init_scale)²); ``sinusoidal`` starts the *learned* table at Vaswani et al.'s sinusoids with
        the token embeddings' RMS times ``init_scale`` (docs/order_use.md).  The padding row stays zero."""
        if not hasattr(self, "init"):  # nn.Embedding.__init__ calls this before our attributes exist
            return super().reset_parameters()
        with torch.no_grad():
            if self.init == "sinusoidal":
                rows = self.weight.shape[0] - self.pad - 1
                table = sinusoidal_table(rows, self.weight.shape[1]) * sinusoidal_scale("match_tokens",
                                                                                         self.initializer_range)
                self.weight.zero_()
                self.weight[self.pad + 1:] = table * self.init_scale
            else:
                self.weight.normal_(0.0, self.initializer_range * self.init_scale)
                self.weight[self.pad].zero_()

    def forward(self, position_ids: Tensor, attention_mask: Tensor) -> Tensor:  # type: ignore[override]
        ids = torch.where(attention_mask.bool(), position_ids + self.pad + 1, self.pad)
        return super().forward(ids)


def sinusoidal_table(num_positions: int, dim: int, base: float = 10000.0) -> Tensor:
    """Fixed sinusoidal table of Vaswani et al. (2017), §3.5, interleaved: ``PE[p, 2i] = sin(p / base^(2i/dim))``,
    ``PE[p, 2i+1] = cos(p / base^(2i/dim))``."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)
    angle = pos / base ** (two_i / dim)
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table.float()


def sinusoidal_scale(scale: float | str, initializer_range: float) -> float:
    """Factor on the sinusoidal table: a number, or ``"match_tokens"`` = ``initializer_range·√2``.

    The table has RMS 1/√2 per entry; Vaswani et al. balance it against token embeddings times √d_model, but RoBERTa's
    start at N(0, 0.02²) unscaled, so an unscaled table outweighs them ~35:1 at d = 128 and every such model collapsed
    at emergence_cpu's budget (docs/emergence.md).  ``match_tokens`` gives it the tokens' initial RMS (our choice).
    """
    if scale == "match_tokens":
        return float(initializer_range) * math.sqrt(2.0)
    try:
        return float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"pos.scale must be a number or 'match_tokens', got {scale!r}") from None


class SinusoidalPositionEmbedding(nn.Module):
    """Non-learned sinusoidal absolute positions (Vaswani et al. 2017), added at the input, times
    ``sinusoidal_scale`` (``pos.scale``; a config saved without it — before the option — means 1)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        base = float(config.pos.get("base", 10000.0))
        factor = sinusoidal_scale(config.pos.get("scale", 1.0), config.initializer_range)
        # Not persistent: the table is a function of the config, so checkpoints stay small.
        self.register_buffer("table", sinusoidal_table(config.max_len, config.hidden_size, base) * factor,
                             persistent=False)

    def forward(self, position_ids: Tensor, attention_mask: Tensor) -> Tensor:
        pos = position_ids.clamp(max=self.table.shape[0] - 1)
        return self.table[pos] * attention_mask[..., None].to(self.table.dtype)


# --------------------------------------------------------------------------------------- attention (relative) schemes
def relative_offsets(position_ids: Tensor) -> Tensor:
    """``offset[b, i, j] = pos[b, i] - pos[b, j]`` (query minus key), shape ``[B, T, T]``."""
    return position_ids[:, :, None] - position_ids[:, None, :]


class RelativeKeyQuery(nn.Module):
    """Learned relative-position representations in attention, clipped at a max distance.

    Shaw et al. (2018) add ``q_i · a_{ij}`` to the logits; Huang et al. (2020, "Improve Transformer Models with Better
    Relative Position Embeddings", method 4) also ``k_j · a_{ij}`` — transformers 4.x's ``relative_key_query``, the
    variant Luo et al. (2021) trained.  ``a_{ij} = A[clip(i - j, -K, K) + K]``, one ``A ∈ R^{(2K+1) × d_head}`` per
    layer shared by its heads.  Its vectors interact with content, so position can leak into hidden states as the
    paper's probes test.  Causal form: only ``i - j >= 0`` occurs, so ``A ∈ R^{(K+1) × d_head}`` indexed by ``clip(i -
    j, 0, K)`` (as T5's decoder buckets).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.max_distance = int(config.pos.get("max_distance", 64))
        self.causal = bool(getattr(config, "causal", False))
        rows = self.max_distance + 1 if self.causal else 2 * self.max_distance + 1
        self.distance_embedding = nn.Embedding(rows, config.head_dim)
        self.scale = 1.0 / math.sqrt(config.head_dim)

    def forward(self, q: Tensor, k: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        K = self.max_distance
        offsets = relative_offsets(position_ids)
        # causal: future keys (negative offsets) are masked anyway; clamping them to row 0 keeps the gather valid
        idx = offsets.clamp(0, K) if self.causal else offsets.clamp(-K, K) + K  # [B, T, T]
        table = self.distance_embedding.weight.to(q.dtype)
        # Project onto the (2K+1) distance vectors first, then gather: O(T·K) instead of
        # materialising a [T, T, Dh] tensor of distance vectors.
        q_rel = q @ table.T  # [B, H, T, 2K+1]
        k_rel = k @ table.T
        B, H, T, _ = q.shape
        gather_idx = idx[:, None].expand(B, H, T, T)
        bias_q = torch.gather(q_rel, -1, gather_idx)  # q_i · a_{ij}
        bias_k = torch.gather(k_rel, -1, gather_idx.transpose(-1, -2)).transpose(-1, -2)  # k_j · a_{ij}
        return q, k, (bias_q + bias_k) * self.scale


def rope_cos_sin(position_ids: Tensor, dim: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Cos/sin tables of rotary embeddings, shape ``[B, 1, T, dim]`` (half-rotation layout)."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float32) / dim)
    angles = position_ids[..., None].float() * inv_freq  # [B, T, dim/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class RotaryPositions(nn.Module):
    """Rotary position embedding, RoPE (Su et al. 2021, "RoFormer"): q and k rotated so that ``<R_i q, R_j k> = <q,
    R_{j-i} k>``; GPT-NeoX / transformers' half-rotation layout (``rotate_half``)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.base = float(config.pos.get("base", 10000.0))
        self.dim = config.head_dim
        if self.dim % 2:
            raise ValueError(f"rope needs an even head dimension (got {self.dim})")

    def forward(self, q: Tensor, k: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor, None]:
        cos, sin = rope_cos_sin(position_ids, self.dim, self.base, q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, None


def alibi_slopes(num_heads: int) -> Tensor:
    """Head slopes of ALiBi (Press et al. 2022): geometric ``2^(-8h/n)``; for a head count
    that is not a power of two, the interpolation of the reference implementation."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = power_of_two(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBiPositions(nn.Module):
    """Attention with Linear Biases, ALiBi (Press et al. 2022), symmetric for an encoder.

    Adds ``-m_h · |i - j|`` to head ``h``'s logits (bidirectional encoders such as MosaicBERT use the symmetric
    distance).  Under the causal mask this is exactly Press et al.'s decoder bias up to a per-row constant the softmax
    ignores, so one module serves both objectives.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(config.num_heads), persistent=False)

    def forward(self, q: Tensor, k: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        dist = relative_offsets(position_ids).abs().to(q.dtype)  # [B, T, T]
        return q, k, -self.slopes.to(q.dtype)[None, :, None, None] * dist[:, None]


# ----------------------------------------------------------------------------------------------------------- registry
class PositionScheme:
    """One registry entry: builders for the input and the per-layer attention plug-ins."""

    def __init__(self, name: str, input_module: Callable[[EncoderConfig], nn.Module] | None = None,
                 attention_module: Callable[[EncoderConfig], nn.Module] | None = None, hf_exportable: bool = False,
                 description: str = "") -> None:
        self.name, self.input_module, self.attention_module = name, input_module, attention_module
        self.hf_exportable, self.description = hf_exportable, description


POSITION_SCHEMES: dict[str, PositionScheme] = {}


def register(scheme: PositionScheme) -> PositionScheme:
    if scheme.name in POSITION_SCHEMES:
        raise ValueError(f"position scheme {scheme.name!r} registered twice")
    POSITION_SCHEMES[scheme.name] = scheme
    return scheme


register(PositionScheme("learned", LearnedPositionEmbedding, None, True, "learned absolute (RoBERTa)"))
register(PositionScheme("none", None, None, True, "no position information anywhere"))
register(PositionScheme("sinusoidal", SinusoidalPositionEmbedding, None, False, "fixed sinusoidal absolute (Vaswani et al. 2017)"))
register(PositionScheme("relative", None, RelativeKeyQuery, False, "learned relative key+query (Shaw et al. 2018; Huang et al. 2020)"))
register(PositionScheme("rope", None, RotaryPositions, False, "rotary (Su et al. 2021)"))
register(PositionScheme("alibi", None, ALiBiPositions, False, "linear attention biases (Press et al. 2022)"))


def get_scheme(name: str) -> PositionScheme:
    try:
        return POSITION_SCHEMES[name]
    except KeyError:
        raise ValueError(
            f"unknown position scheme {name!r}; valid: {', '.join(sorted(POSITION_SCHEMES))}"
        ) from None
