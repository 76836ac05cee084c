"""RoBERTa encoder with a pluggable position scheme, and its masked-LM head.

Post-LayerNorm blocks as in RoBERTa (Liu et al. 2019): an embeddings LayerNorm, and per
layer an attention-output LayerNorm and an output LayerNorm — the LayerNorms whose gain
and bias the outlier literature tracks (Kovaleva et al. 2021; Puccetti et al. 2022).

Written here rather than taken from transformers because transformers 5 dropped relative
positions from RoBERTa and never had "no positions" (see DESIGN.md). Parameter names are
those of ``transformers.RobertaForMaskedLM`` so learned/none models export unchanged
(:mod:`models.export`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import EncoderConfig
from .positions import get_scheme


@dataclass
class EncoderOutput:
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class MaskedLMOutput:
    loss: Tensor | None
    logits: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """0-based index of each token among the non-padding tokens of its row (pads: 0)."""
    mask = attention_mask.long()
    return (torch.cumsum(mask, dim=1) - 1).clamp(min=0) * mask


class Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        scheme = get_scheme(config.pos_name)
        # Absent (None) for schemes without an input term; HF export writes a zero table then.
        self.position_embeddings = scheme.input_module(config) if scheme.input_module else None
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids, attention_mask)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_dropout
        scheme = get_scheme(config.pos_name)
        self.position_scheme = scheme.attention_module(config) if scheme.attention_module else None

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self, x: Tensor, key_mask_bias: Tensor, position_ids: Tensor, output_attentions: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        bias = key_mask_bias  # [B, 1, 1, T]: 0 for real keys, a large negative for padding
        if self.position_scheme is not None:
            q, k, pos_bias = self.position_scheme(q, k, position_ids)
            if pos_bias is not None:
                bias = bias + pos_bias
        p = self.dropout_p if self.training else 0.0
        if output_attentions:
            # Eager path: the probabilities are wanted (attention-sink analyses).
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + bias
            probs = scores.softmax(dim=-1)
            ctx = F.dropout(probs, p, self.training) @ v
        else:
            probs = None
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=p)
        B, H, T, D = ctx.shape
        return ctx.transpose(1, 2).reshape(B, T, H * D), probs

    def attention_logits(self, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Scaled pre-softmax scores incl. the position bias, ``[B, H, T, T]`` (for analysis/tests)."""
        B, T, _ = x.shape
        mask = torch.ones(B, T, dtype=torch.long, device=x.device) if attention_mask is None else attention_mask
        q, k = self._heads(self.query(x)), self._heads(self.key(x))
        bias = torch.zeros((), dtype=x.dtype, device=x.device)
        if self.position_scheme is not None:
            q, k, pos_bias = self.position_scheme(q, k, position_ids_from_mask(mask))
            if pos_bias is not None:
                bias = pos_bias
        return q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + bias


class AttentionOutput(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class Attention(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.self = SelfAttention(config)
        self.output = AttentionOutput(config)


class Intermediate(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.dense(x))  # exact (erf) GELU, as HF's "gelu"


class Output(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class Layer(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = Output(config)

    def forward(self, x, key_mask_bias, position_ids, output_attentions=False):
        ctx, probs = self.attention.self(x, key_mask_bias, position_ids, output_attentions)
        x = self.attention.output(ctx, x)
        return self.output(self.intermediate(x), x), probs


class Encoder(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_layers))


class RobertaEncoder(nn.Module):
    """The encoder body (``RobertaModel`` without pooler)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        if input_ids.shape[1] > self.config.max_len:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds the model's max_len={self.config.max_len}; "
                "truncate the input or use a model with more positions"
            )
        if attention_mask is None:
            attention_mask = (input_ids != self.config.pad_token_id).long()
        position_ids = position_ids_from_mask(attention_mask)
        x = self.embeddings(input_ids, attention_mask, position_ids)
        # Large negative instead of -inf keeps rows finite even when a row is all padding.
        key_mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        hidden, attns = [x], []
        for layer in self.encoder.layer:
            x, probs = layer(x, key_mask_bias, position_ids, output_attentions)
            hidden.append(x)
            attns.append(probs)
        return EncoderOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attns) if output_attentions else None,
        )


class LMHead(nn.Module):
    """RoBERTa's MLM head: dense -> GELU -> LayerNorm -> decoder tied to the input embeddings."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: Tensor, decoder_weight: Tensor) -> Tensor:
        x = self.layer_norm(F.gelu(self.dense(x)))
        return F.linear(x, decoder_weight, self.bias)


class RobertaMaskedLM(nn.Module):
    """RoBERTa encoder + tied MLM head; parameter names as ``transformers.RobertaForMaskedLM``."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.roberta = RobertaEncoder(config)
        self.lm_head = LMHead(config)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # BERT/RoBERTa initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm gains.
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> MaskedLMOutput:
        out = self.roberta(input_ids, attention_mask, output_hidden_states, output_attentions)
        logits = self.lm_head(out.last_hidden_state, self.roberta.embeddings.word_embeddings.weight)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1), ignore_index=-100)
        return MaskedLMOutput(loss, logits, out.hidden_states, out.attentions)

    def named_layernorms(self) -> dict[str, nn.LayerNorm]:
        """The encoder's LayerNorms tracked by the outlier literature, in depth order:
        ``embeddings``, then per layer ``layer.{i}.attention_output`` and ``layer.{i}.output``."""
        lns = {"embeddings": self.roberta.embeddings.LayerNorm}
        for i, layer in enumerate(self.roberta.encoder.layer):
            lns[f"layer.{i}.attention_output"] = layer.attention.output.LayerNorm
            lns[f"layer.{i}.output"] = layer.output.LayerNorm
        return lns
