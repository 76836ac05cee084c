"""Transformer blocks of the encoder: RoBERTa's (post- or pre-LN) and the Outlier-Protected block.

Module names follow ``transformers.RobertaLayer`` in every variant, so RoBERTa hooks (``layer.output.dense`` = FFN
output) keep working and the default state dict is unchanged; ``outlierlab.models.hook_points`` names their
activations.

Post-LN (RoBERTa; Liu et al. 2019), with ``f`` the attention or FFN sublayer::

    x ← LN(x + f(x))

Pre-LN (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture")::

    x ← x + f(LN(x))            … and one more LN after the last block (in the encoder)

each sublayer keeping its RoBERTa-named norm (``attention.output.LayerNorm`` before attention, ``output.LayerNorm``
before the FFN).

Outlier-Protected block (He, Noci, Paliotta, Schlag & Hofmann 2024, "Understanding and Minimising Outlier Features in
Transformer Training", NeurIPS 2024, §4 and Fig. 3)::

    x ← x + β_SA · W_O · MHA(x)      with  A = softmax(N(x W_Q) N(x W_K)ᵀ / √d_h)   (QK-norm)
    x ← x + β_FF · W_2 · GELU(W_1 x)

No normalisation in the residual branches; entropy is regulated by the per-head RMSNorm N of queries and keys, and β < 1
down-weights the branches to restore signal propagation.  As their configuration
(github.com/bobby-he/simplified_transformers, ``config/model/op.yaml``): β = 0.2 at 12 layers scaled as 1/√depth, fixed
(``op_beta``, ``op_beta_trainable`` override); no MLP-input scaling.  The embeddings and MLM-head LayerNorms are outside
the branches and kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import SelfAttention
from .config import EncoderConfig
from .norms import make_norm


class AttentionOutput(nn.Module):
    """Attention output projection; ``LayerNorm`` is ``None`` in the OP block."""

    def __init__(self, config: EncoderConfig, norm: bool = True, in_features: int | None = None) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size)
        self.LayerNorm = make_norm(config.norm, config.hidden_size, config.layer_norm_eps) if norm else None
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, h: Tensor, residual: Tensor) -> Tensor:
        """Post-LN sublayer end: ``LN(dropout(W h) + residual)``."""
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class Attention(nn.Module):
    def __init__(self, config: EncoderConfig, norm: bool = True, qk_norm: bool = False) -> None:
        super().__init__()
        self.self = SelfAttention(config, qk_norm=qk_norm)
        self.output = AttentionOutput(config, norm=norm)


class Intermediate(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.dense(x))  # exact (erf) GELU, as HF's "gelu"


class Output(AttentionOutput):
    """FFN down-projection; ``LayerNorm`` is ``None`` in the OP block."""

    def __init__(self, config: EncoderConfig, norm: bool = True) -> None:
        super().__init__(config, norm, config.intermediate_size)


class Layer(nn.Module):
    """RoBERTa block, post-LN (default) or pre-LN (``config.norm_placement``)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = Output(config)
        # Parameter-free marker of the residual stream this block hands on (a hook site).
        self.residual_out = nn.Identity()

    def forward(self, x, key_mask_bias, position_ids, output_attentions=False):
        attn, out = self.attention, self.output
        if self.pre_norm:
            ctx, probs = attn.self(attn.output.LayerNorm(x), key_mask_bias, position_ids, output_attentions)
            x = x + attn.output.dropout(attn.output.dense(ctx))
            x = x + out.dropout(out.dense(self.intermediate(out.LayerNorm(x))))
            return self.residual_out(x), probs
        ctx, probs = attn.self(x, key_mask_bias, position_ids, output_attentions)
        x = attn.output(ctx, x)
        return self.residual_out(out(self.intermediate(x), x)), probs


class OPLayer(nn.Module):
    """Outlier-Protected block of He et al. (2024); equations in the module docstring."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.attention = Attention(config, norm=False, qk_norm=True)
        self.intermediate = Intermediate(config)
        self.output = Output(config, norm=False)
        # One scalar per branch and layer; fixed (a buffer) unless model.op_beta_trainable, as in He et al.
        beta = config.op_beta_value
        for name in ("attention_beta", "output_beta"):
            if config.op_beta_trainable:
                setattr(self, name, nn.Parameter(torch.tensor(beta)))
            else:
                self.register_buffer(name, torch.tensor(beta))
        self.residual_out = nn.Identity()

    def forward(self, x, key_mask_bias, position_ids, output_attentions=False):
        attn, out = self.attention, self.output
        ctx, probs = attn.self(x, key_mask_bias, position_ids, output_attentions)
        x = x + self.attention_beta * attn.output.dropout(attn.output.dense(ctx))
        x = x + self.output_beta * out.dropout(out.dense(self.intermediate(x)))
        return self.residual_out(x), probs


def make_layer(config: EncoderConfig) -> nn.Module:
    """The block chosen by ``config.block`` (and, for ``roberta``, ``config.norm_placement``)."""
    return OPLayer(config) if config.block == "op" else Layer(config)
