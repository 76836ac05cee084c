"""Multi-head self-attention with the ``model.attention`` switch and optional QK-norm.

* ``softmax`` — RoBERTa's scaled dot-product attention (``F.scaled_dot_product_attention`` unless the probabilities
  are asked for);
* ``clipped_softmax`` — Bondarenko, Nagel & Blankevoort (2023), "Quantizable Transformers: Removing Outliers by
  Helping Attention Heads Do Nothing", §4.1: ``clip((ζ - γ)·softmax(x) + γ, 0, 1)``.  With γ < 0 a head gives a key
  *exactly* zero weight from finite logits, so "doing nothing" needs no huge logits and their outlier activations;
* ``gated`` — the same paper, §4.2: ``π(G(x)) ⊙ softmax(QKᵀ/√d) V`` per head, π the sigmoid and G a small function
  of the token's input (``HeadGate``): a head switches off through its gate.

With ``causal=True`` a query sees only itself and earlier keys: SDPA's ``is_causal=True`` when nothing else needs a
mask, else the same additive bias (``hide_future``).  Position schemes act before the probabilities (rotating q/k or
biasing logits), so they compose with each kind; only plain softmax uses the fused kernel.

QK-norm (``qk_norm=True``; the OP block) normalises queries and keys per head before the position scheme — the
entropy-regulation mechanism of He et al. (2024) (Dehghani et al. 2023; Wortsman et al. 2023).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import EncoderConfig
from .norms import make_norm
from .positions import get_scheme


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """0-based index of each token among the non-padding tokens of its row (pads: 0)."""
    mask = attention_mask.long()
    return (torch.cumsum(mask, dim=1) - 1).clamp(min=0) * mask


def hide_future(scores_or_bias: Tensor, T: int) -> Tensor:
    """The causal mask applied to logits or an additive bias (broadcast to ``[..., T, T]``), with the dtype's smallest
    finite value rather than ``-inf``, so a padded row with no visible real key stays finite, not NaN."""
    future = torch.ones(T, T, dtype=torch.bool, device=scores_or_bias.device).triu(1)  # key j after query i: j > i
    return torch.where(future, torch.finfo(scores_or_bias.dtype).min, scores_or_bias)


def clipped_softmax(scores: Tensor, gamma: float, zeta: float, dim: int = -1) -> Tensor:
    """Clipped softmax of Bondarenko et al. (2023), §4.1: ``clip((ζ - γ)·softmax(x) + γ, 0, 1)``.

    The softmax is stretched to (γ, ζ) and clipped to [0, 1] (γ = 0, ζ = 1 is softmax); a clipped value is exactly 0 or
    1 with zero gradient, so it stops pulling its logit towards ±∞.  Their BERT setting: γ = -0.025, ζ = 1 at T = 128 (α
    = -γ·T = 3.2); for OPT γ = -α/T with α = 12 at T = 512 (github.com/qualcomm-ai-research/outlier-free-transformers).
    Keeping their BERT α at another length: γ = -3.2/T.  Rows need not sum to one.
    """
    return ((zeta - gamma) * scores.softmax(dim=dim) + gamma).clamp(0.0, 1.0)


class HeadGate(nn.Module):
    """Per-head sigmoid gate of gated attention (Bondarenko et al. 2023, §4.2).

    ``gate_h(x_t) = sigmoid(G_h(x_t))`` multiplies head ``h``'s output at token ``t``; ``G`` (config ``gate``):
    ``linear`` — per head, a linear map of the head's slice ``x_t[h·d_h:(h+1)·d_h]`` (their OPT recipe); ``mlp`` — per
    head, a one-hidden-layer ReLU MLP of that slice, width ``gate_hidden`` (default ``d_h // 4``; their BERT recipe, our
    default); ``all_heads_linear`` — one map of the full ``x_t``.  The initial gate is ``sigmoid(gate_bias_init)``
    (their π_init).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.kind = config.gate
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.bias_init, self.std = float(config.gate_bias_init), config.initializer_range
        H, Dh = self.num_heads, self.head_dim
        if self.kind == "linear":
            self.weight = nn.Parameter(torch.empty(H, Dh))
        elif self.kind == "mlp":
            n = config.gate_width
            self.hidden_weight = nn.Parameter(torch.empty(H, Dh, n))
            self.hidden_bias = nn.Parameter(torch.empty(H, n))
            self.weight = nn.Parameter(torch.empty(H, n))
        else:  # all_heads_linear
            self.weight = nn.Parameter(torch.empty(H, config.hidden_size))
        self.bias = nn.Parameter(torch.empty(H))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.std)
        nn.init.constant_(self.bias, self.bias_init)
        if self.kind == "mlp":
            nn.init.normal_(self.hidden_weight, std=self.std)
            nn.init.zeros_(self.hidden_bias)

    def logits(self, x: Tensor) -> Tensor:
        """Gate logits ``G(x)``, shape ``[B, H, T]``."""
        B, T, _ = x.shape
        if self.kind == "all_heads_linear":
            g = x @ self.weight.T  # [B, T, H]
        else:
            xh = x.view(B, T, self.num_heads, self.head_dim)
            if self.kind == "linear":
                g = torch.einsum("bthd,hd->bth", xh, self.weight)
            else:
                hidden = F.relu(torch.einsum("bthd,hdn->bthn", xh, self.hidden_weight) + self.hidden_bias)
                g = torch.einsum("bthn,hn->bth", hidden, self.weight)
        return (g + self.bias).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        """Gates in (0, 1), shape ``[B, H, T, 1]`` (broadcasts over a head's output dims)."""
        return torch.sigmoid(self.logits(x))[..., None]


class SelfAttention(nn.Module):
    """Multi-head self-attention; parameter names as ``RobertaSelfAttention`` (query/key/value)."""

    def __init__(self, config: EncoderConfig, qk_norm: bool = False) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_dropout
        self.causal = bool(config.causal)
        scheme = get_scheme(config.pos_name)
        self.position_scheme = scheme.attention_module(config) if scheme.attention_module else None
        # Registered after the RoBERTa modules only when used: the default model's parameters, their
        # order and hence their seeded initial values are unchanged.
        self.kind = config.attention
        self.gamma, self.zeta = float(config.clip_gamma), float(config.clip_zeta)
        self.gate = HeadGate(config) if self.kind == "gated" else None
        if qk_norm:
            # RMSNorm with a gain whatever model.norm says: He et al.'s OP configuration (qk_norm_type: rmsnorm)
            self.query_norm = make_norm("rmsnorm", config.head_dim, config.layer_norm_eps)
            self.key_norm = make_norm("rmsnorm", config.head_dim, config.layer_norm_eps)
        else:
            self.query_norm = self.key_norm = None
        # Parameter-free marker of the attention probabilities on the explicit path (the site
        # blocks.{i}.attn.pattern, outlierlab.models.hook_points): a hook on it may replace them before they weigh
        # the values.  No parameter, so the state dict and the seeded initialisation are unchanged.
        self.pattern = nn.Identity()

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def _qk(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        q, k = self._heads(self.query(x)), self._heads(self.key(x))
        if self.query_norm is not None:
            # QK-norm before the position scheme: RoPE then rotates unit-scale vectors, and a relative
            # or ALiBi bias is added to logits whose content part is bounded.
            q, k = self.query_norm(q), self.key_norm(k)
        pos_bias = None
        if self.position_scheme is not None:
            q, k, pos_bias = self.position_scheme(q, k, position_ids)
        return q, k, pos_bias

    def probabilities(self, scores: Tensor) -> Tensor:
        """Attention weights from scaled logits incl. masks/position bias (softmax or clipped softmax)."""
        if self.kind == "clipped_softmax":
            return clipped_softmax(scores, self.gamma, self.zeta)
        return scores.softmax(dim=-1)

    def forward(self, x: Tensor, key_mask_bias: Tensor | None, position_ids: Tensor,
                output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        """``key_mask_bias`` ``[B, 1, 1, T]``: 0 for real keys, a large negative for padding; ``None`` when
        nothing is padded -- then plain softmax with a bias-free scheme calls SDPA with no mask at all, and a
        causal model passes ``is_causal=True`` (the fused causal kernels; no ``[T, T]`` mask is made)."""
        q, k, pos_bias = self._qk(x, position_ids)
        v = self._heads(self.value(x))
        bias = key_mask_bias
        if pos_bias is not None:  # ALiBi / relative: a per-head bias on the logits, mask or not
            bias = pos_bias if bias is None else bias + pos_bias
        T = x.shape[1]
        p = self.dropout_p if self.training else 0.0
        if output_attentions or self.kind == "clipped_softmax":
            # Explicit path: the probabilities are wanted (attention-sink analyses) or are not a softmax.
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
            if bias is not None:
                scores = scores + bias
            if self.causal:
                scores = hide_future(scores, T)
            probs = self.pattern(self.probabilities(scores))
            ctx = F.dropout(probs, p, self.training) @ v
        else:
            probs = None
            if bias is not None and self.causal:
                bias = hide_future(bias.to(q.dtype), T)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=None if bias is None else bias.to(q.dtype),
                                                 dropout_p=p, is_causal=self.causal and bias is None)
        if self.gate is not None:
            ctx = ctx * self.gate(x)  # [B, H, T, Dh] * [B, H, T, 1]: each head's update, per token
        B, H, T, D = ctx.shape
        return ctx.transpose(1, 2).reshape(B, T, H * D), (probs if output_attentions else None)
