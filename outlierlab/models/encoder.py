"""RoBERTa encoder with a pluggable position scheme, architecture switches, and its masked-LM head.

By default post-LayerNorm blocks as in RoBERTa (Liu et al. 2019), whose LayerNorm gains and biases the outlier
literature tracks (Kovaleva et al. 2021; Puccetti et al. 2022).  The switches of ``EncoderConfig`` live in ``norms``,
``attention`` and ``blocks`` (docs/architectures.md).  Our own code because transformers 5 dropped relative positions
from RoBERTa and never had "no positions" (docs/design.md); parameter names are ``transformers.RobertaForMaskedLM``'s,
so learned/none models export unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils.checkpoint
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import SelfAttention, position_ids_from_mask
from .blocks import Layer, OPLayer, make_layer
from .config import EncoderConfig
from .norms import NORM_TYPES, make_norm, reset_norm
from .positions import LearnedPositionEmbedding, get_scheme

__all__ = ["EncoderOutput", "MaskedLMOutput", "RobertaEncoder", "RobertaMaskedLM", "SelfAttention",
           "Layer", "OPLayer", "position_ids_from_mask"]


@dataclass
class EncoderOutput:
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class MaskedLMOutput:
    """``logits`` are ``[B, T, V]`` (every position), or ``[N, V]`` at the ``N`` masked positions when the loss
    was computed on those only; ``masked_positions`` then holds their flat indices into ``B*T``."""

    loss: Tensor | None
    logits: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    masked_positions: Tensor | None = None


class Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        scheme = get_scheme(config.pos_name)
        # Absent (None) for schemes without an input term; HF export writes a zero table then.
        self.position_embeddings = scheme.input_module(config) if scheme.input_module else None
        # Not in a residual branch: kept by every block kind (its kind follows model.norm).
        self.LayerNorm = make_norm(config.norm, config.hidden_size, config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids, attention_mask)
        return self.dropout(self.LayerNorm(x))


class Encoder(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(make_layer(config) for _ in range(config.num_layers))
        # Pre-LN leaves the stream unnormalised after the last block; one final LN (Xiong et al. 2020).
        if config.block == "roberta" and config.norm_placement == "pre":
            self.LayerNorm = make_norm(config.norm, config.hidden_size, config.layer_norm_eps)
        else:
            self.LayerNorm = None


class RobertaEncoder(nn.Module):
    """The encoder body (``RobertaModel`` without pooler)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        # Activation checkpointing (a training setting, not part of the architecture or its exports): each layer's
        # activations are recomputed in the backward pass instead of kept, trading ~one extra forward for memory.
        self.activation_checkpointing = False

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> EncoderOutput:
        """``attention_mask`` ``[B, T]`` (1 = token, 0 = padding), or ``None`` when no position is padding
        (as in ``transformers``: ``None`` means all ones). ``None`` runs attention without a mask."""
        if input_ids.shape[1] > self.config.max_len:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the model's max_len={self.config.max_len}; "
                             "truncate the input or use a model with more positions")
        if attention_mask is None:
            # No padding: attention runs without any mask, so F.scaled_dot_product_attention may take its
            # FlashAttention / memory-efficient kernels on a GPU (an additive mask rules those out). Packed
            # MLM blocks are unpadded except the last one; the training module drops their all-ones mask.
            B, T = input_ids.shape
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
            x = self.embeddings(input_ids, torch.ones_like(input_ids), position_ids)
            key_mask_bias = None
        else:
            position_ids = position_ids_from_mask(attention_mask)
            x = self.embeddings(input_ids, attention_mask, position_ids)
            # Large negative instead of -inf keeps rows finite even when a row is all padding.
            key_mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        hidden, attns = [x], []
        # getattr: the exported Hugging Face wrappers reuse this forward without the attribute (they never recompute)
        recompute = getattr(self, "activation_checkpointing", False) and self.training and torch.is_grad_enabled()
        for layer in self.encoder.layer:
            if recompute and not output_attentions:
                # non-reentrant: works with inputs that need no grad and with torch.compile; the RNG state is
                # restored for the recomputation, so dropout draws the same masks (equal to the plain path)
                x, probs = torch.utils.checkpoint.checkpoint(layer, x, key_mask_bias, position_ids, False,
                                                             use_reentrant=False)
            else:
                x, probs = layer(x, key_mask_bias, position_ids, output_attentions)
            hidden.append(x)
            attns.append(probs)
        if self.encoder.LayerNorm is not None:
            # As GPT-2 in transformers: the last hidden state is the final LN's output.
            x = self.encoder.LayerNorm(x)
            hidden[-1] = x
        return EncoderOutput(last_hidden_state=x, hidden_states=tuple(hidden) if output_hidden_states else None,
                             attentions=tuple(attns) if output_attentions else None)


def _upcast(logits: Tensor) -> Tensor:
    """fp16/bf16 logits to fp32 for the softmax of the loss (mixed precision); fp32/fp64 stay as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


class LMHead(nn.Module):
    """RoBERTa's MLM head: dense -> GELU -> LayerNorm -> decoder tied to the input embeddings."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.padding = config.padded_vocab_size - config.vocab_size

    def forward(self, x: Tensor, decoder_weight: Tensor) -> Tensor:
        """Logits over the embedding's rows: with ``model.vocab_multiple`` padding, the padded classes' are -inf
        (a -inf bias: their softmax share, and so every gradient through them, is exactly 0)."""
        x = self.layer_norm(F.gelu(self.dense(x)))
        bias = F.pad(self.bias, (0, self.padding), value=float("-inf")) if self.padding else self.bias
        return F.linear(x, decoder_weight, bias)


class RobertaMaskedLM(nn.Module):
    """RoBERTa encoder + tied LM head; parameter names as ``transformers.RobertaForMaskedLM``.

    One class for both objectives: with ``config.causal`` the blocks attend to the past only and ``labels``
    are scored as next tokens (the body and head of ``transformers.RobertaForCausalLM``); otherwise as masked
    tokens (``RobertaForMaskedLM``).
    """

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
        elif isinstance(module, LearnedPositionEmbedding):
            module.reset_parameters()  # pos.init / pos.init_scale (N(0, std²) by default, as below)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, NORM_TYPES):
            reset_norm(module)  # unit gain, zero bias where the norm has them

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                masked_positions: Tensor | None = None, full_logits: bool = False) -> MaskedLMOutput:
        """Encoder + MLM head; with ``labels`` (-100 = not predicted) also the mean cross-entropy.

        With ``labels`` the head runs only at the labelled positions, as fairseq's ``masked_tokens``: at 15 % masking
        the head (more than half a small model's FLOPs) costs 0.15x and no ``[B·T, V]`` logits are made; loss and
        gradients are the full head's (tests/test_masked_head.py).  ``logits`` are then ``[N, V]`` at
        ``masked_positions`` (flat indices into ``B·T``), which the caller may precompute on the host (``nonzero`` on a
        GPU waits for the device). ``full_logits=True`` (or no ``labels``) gives ``[B, T, V]``.  ``masked_positions``
        without ``labels``: those rows' logits and no loss, for either objective.
        """
        out = self.roberta(input_ids, attention_mask, output_hidden_states, output_attentions)
        decoder = self.roberta.embeddings.word_embeddings.weight
        hidden = out.last_hidden_state
        if labels is None and masked_positions is not None:
            logits = self.lm_head(hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked_positions), decoder)
            return MaskedLMOutput(None, self._vocab(logits), out.hidden_states, out.attentions, masked_positions)
        if self.config.causal and labels is not None:
            return self._next_token_loss(out, hidden, decoder, labels, full_logits)
        if labels is None or full_logits:
            logits = self.lm_head(hidden, decoder)
            loss = None
            if labels is not None:
                loss = F.cross_entropy(_upcast(logits.view(-1, logits.shape[-1])), labels.view(-1), ignore_index=-100)
            return MaskedLMOutput(loss, self._vocab(logits), out.hidden_states, out.attentions)
        flat_labels = labels.reshape(-1)
        if masked_positions is None:
            masked_positions = (flat_labels != -100).nonzero().squeeze(1)
        logits = self.lm_head(hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked_positions), decoder)
        targets = flat_labels.index_select(0, masked_positions)
        # sum / max(N, 1): a batch without any masked token gives loss 0 (and zero gradients), not the
        # NaN of a mean over nothing; N is the index tensor's length, known on the host (no device sync).
        loss = F.cross_entropy(_upcast(logits), targets, reduction="sum") / max(int(masked_positions.numel()), 1)
        return MaskedLMOutput(loss, self._vocab(logits), out.hidden_states, out.attentions, masked_positions)

    def _vocab(self, logits: Tensor) -> Tensor:
        """The tokenizer's vocabulary of ``logits``: with ``model.vocab_multiple`` padding the padded columns (all
        -inf, used only inside the loss) are dropped as a view, without a copy."""
        return logits[..., : self.config.vocab_size] if self.lm_head.padding else logits

    def _next_token_loss(self, out: EncoderOutput, hidden: Tensor, decoder: Tensor, labels: Tensor,
                         full_logits: bool) -> MaskedLMOutput:
        """Causal-LM loss: position ``t`` predicts ``labels[t + 1]`` (Radford et al. 2019).

        ``labels`` are unshifted input ids with -100 where not predicted; the head runs on positions ``0..T-2``, so
        ``logits`` are ``[B, T-1, V]`` (``[B, T, V]`` with ``full_logits``).  Mean over predicted tokens, sum / max(N,
        1): nothing to predict gives 0, not NaN, without a host sync.
        """
        logits = self.lm_head(hidden if full_logits else hidden[:, :-1], decoder)
        shifted = logits[:, :-1] if full_logits else logits
        targets = labels[:, 1:].reshape(-1)
        total = F.cross_entropy(_upcast(shifted.reshape(-1, shifted.shape[-1])), targets, ignore_index=-100,
                                reduction="sum")
        loss = total / (targets != -100).sum().clamp(min=1)
        return MaskedLMOutput(loss, self._vocab(logits), out.hidden_states, out.attentions)

    def named_layernorms(self) -> dict[str, nn.Module]:
        """The normalisation layers on the residual stream, in depth order — the one list the LayerNorm monitor, rule
        and ablation read: ``embeddings``, per layer ``layer.{i}.attention_output`` and ``layer.{i}.output``, then
        ``final`` (pre-LN).  Whatever norms exist are listed (the OP block has none in its layers); QK-norms and the
        head's LayerNorm are not."""
        lns: dict[str, nn.Module] = {"embeddings": self.roberta.embeddings.LayerNorm}
        for i, layer in enumerate(self.roberta.encoder.layer):
            for key, norm in (("attention_output", layer.attention.output.LayerNorm),
                              ("output", layer.output.LayerNorm)):
                if norm is not None:
                    lns[f"layer.{i}.{key}"] = norm
        if self.roberta.encoder.LayerNorm is not None:
            lns["final"] = self.roberta.encoder.LayerNorm
        return lns
