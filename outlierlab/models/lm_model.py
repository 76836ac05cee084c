"""The frozen encoder's model WITH its own LM head (and eager attention) for the BERT Busters / Puccetti analyses.

The ablation needs the MLM head (Kovaleva et al. 2021) and the attention-sink analysis needs attention probabilities
(eager attention only).  ``load_mlm`` gives both as ``LoadedModel`` on the ``FrozenEncoder``'s weights
(``FrozenEncoder.lm_model``):

* ours (a run, its export, a ``*.ckpt``): the ``RobertaMaskedLM`` itself (``output_attentions=True`` is eager);
* Hugging Face: ``AutoModelForMaskedLM`` for encoders, ``AutoModelForCausalLM`` for decoders (``objective``
  ``next_token``; the family registry, else transformers' auto mappings, says which), loaded once by
  ``placement.load_hf_model``, switched to eager attention in ``forward``.  A checkpoint without LM-head weights
  (e.g. all-MiniLM-L6-v2, a ``BertModel``) never uses the random head: ``has_mlm_head`` is False with a reason,
  and the body still serves the attention and LayerNorm analyses.

``output_layer`` names the head's output layer and ``last_vectors`` captures the vector entering it (Macocco et al.
2025).  LayerNorms get ``model_layernorms``' keys; an unregistered ``model_type`` gets none and a ``family_note``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from outlierlab.metrics.scored_rows import logits_at
from outlierlab.models.families import UnknownFamilyError, family_of, lm_head
from outlierlab.models.family_spec import Family
from outlierlab.models.layernorms import model_layernorms
from outlierlab.models.loading import FrozenEncoder
from outlierlab.models.placement import eager_attention

#: What the model's own head scores: masked tokens (encoders) or the next token (decoders).
OBJECTIVES = ("masked_lm", "next_token")


def layernorm_map(model: nn.Module) -> dict[str, nn.Module]:
    """The model's norms by canonical key, the MLM head's included as ``head`` (judged or zeroed only when
    asked): ``outlierlab.models.layernorms.model_layernorms``, the one list of a model's LayerNorms."""
    return model_layernorms(model, include_head=True)


@dataclass
class ModelOutputs:
    logits: Tensor | None
    hidden_states: tuple[Tensor, ...] | None
    attentions: tuple[Tensor, ...] | None


@dataclass
class LoadedModel:
    """An encoder ready for the MLM / attention analyses (see the module docstring).

    model : the module called (MLM model, or the body without a head); tokenizer : its tokenizer layernorms : key ->
    norm (``layernorm_map``); kind : "outlierlab" or "hf" has_mlm_head : False without weights for its own LM head
    (``no_head_reason`` says why) objective : ``masked_lm`` or ``next_token``; family : its ``Family``, None when
    unregistered (``family_note``)
    """

    model: nn.Module
    tokenizer: Any
    layernorms: dict[str, nn.LayerNorm]
    kind: str
    name: str
    has_mlm_head: bool
    no_head_reason: str = ""
    max_length: int = 512
    objective: str = "masked_lm"
    family: Family | None = None
    family_note: str = ""

    @property
    def is_decoder(self) -> bool:
        return self.objective == "next_token"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def hidden_size(self) -> int:
        config = getattr(self.model, "config", None)  # norms may lack a weight (no-affine) or be absent
        size = getattr(config, "hidden_size", None) or getattr(config, "dim", None)
        return int(size) if size else int(next(iter(self.layernorms.values())).normalized_shape[-1])

    @property
    def num_layers(self) -> int:
        config = getattr(self.model, "config", None)
        n = getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers", None)
        return int(n) if n else len({k.split(".")[1] for k in self.layernorms if k.startswith("layer.")})

    @property
    def bos_token_id(self) -> int:
        """``<s>`` / ``[CLS]``: the first special token of every sequence (a decoder's sink is its first
        token whatever its id: see the attention-sink analysis)."""
        t = self.tokenizer
        return t.cls_token_id if t.cls_token_id is not None else t.bos_token_id

    @property
    def eos_token_id(self) -> int:
        """``</s>`` / ``[SEP]``."""
        t = self.tokenizer
        return t.sep_token_id if t.sep_token_id is not None else t.eos_token_id

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, attention_mask: Tensor, output_attentions: bool = False,
                output_hidden_states: bool = False, rows: Tensor | None = None) -> ModelOutputs:
        """One forward pass; ``logits`` is None without an MLM head; attentions are eager probabilities.  ``rows`` (Bool
        ``[B, T]``): the head projects those positions alone, ``logits`` ``[n, V]``; None: ``[B, T, V]``."""
        dev = self.device
        input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
        narrowed = False
        if self.kind == "outlierlab":  # our head takes the rows itself (RobertaMaskedLM's masked_positions)
            positions = rows.to(dev).reshape(-1).nonzero().squeeze(1) if rows is not None else None
            out = self.model(input_ids, attention_mask, output_hidden_states=output_hidden_states,
                             output_attentions=output_attentions, masked_positions=positions)
            narrowed = positions is not None
        else:
            with eager_attention(self.model), logits_at(self.model, rows if self.has_mlm_head else None) as narrowed:
                out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                 output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                                 return_dict=True)
        logits = getattr(out, "logits", None) if self.has_mlm_head else None
        if logits is not None and rows is not None and not narrowed:
            logits = logits[rows.to(logits.device)]
        return ModelOutputs(logits, getattr(out, "hidden_states", None), getattr(out, "attentions", None))


def load_mlm(encoder, device: str | torch.device | None = None) -> LoadedModel:
    """``encoder`` (a ``FrozenEncoder``, whose weights are used, or a ``name_or_path`` placed on ``device``, default
    CPU) as a ``LoadedModel``; ``has_mlm_head`` False (with a reason) for encoder-only checkpoints."""
    if isinstance(encoder, (str, os.PathLike)):
        encoder = FrozenEncoder(str(encoder), device=str(device) if device is not None else "cpu", lm_head=True)
    src = encoder.source
    model, has_head, reason, objective = encoder.lm_model()
    kind = "hf" if src.kind == "hf" else "outlierlab"
    try:
        family, note, layernorms = family_of(model), "", layernorm_map(model)
    except UnknownFamilyError as e:  # the hidden-state and attention analyses still run
        family, note, layernorms = None, str(e), {}
    return LoadedModel(model=model, tokenizer=encoder.tokenizer, layernorms=layernorms, kind=kind,
                       name=src.name, has_mlm_head=has_head, no_head_reason=reason,
                       max_length=int(encoder.max_length), objective=objective, family=family, family_note=note)


# ------------------------------------------------------------------------------------- the output layer
def output_layer(loaded: LoadedModel) -> tuple[nn.Module, bool, Tensor, Tensor | None, str]:
    """``(module, hook_output, W [V, d], b [V] or None, norm key)``: where h is read (the module's output when
    ``hook_output``, else its input), the output layer's weight and bias, and ``loaded.layernorms``' key of the norm
    producing h ("head" for an MLM head, "final" for a pre-LN decoder)."""
    model = loaded.model
    norm_key = "final" if loaded.is_decoder else "head"
    if loaded.kind == "outlierlab":  # our LMHead: dense -> GELU -> layer_norm -> F.linear(tied embeddings, bias)
        vocab = model.config.vocab_size  # the embedding's rows past it are model.vocab_multiple padding
        return (model.lm_head.layer_norm, True, model.roberta.embeddings.word_embeddings.weight.detach()[:vocab],
                model.lm_head.bias.detach(), norm_key)
    head = lm_head(model)
    if head is None or getattr(head, "weight", None) is None:
        raise ValueError(f"{loaded.name}: no output layer with a weight matrix to split")
    bias = getattr(head, "bias", None)
    return head, False, head.weight.detach(), None if bias is None else bias.detach(), norm_key


@contextmanager
def _capture(module: nn.Module, output: bool, store: list):
    def hook(_m, args, out):
        store.append((out if output else args[0]).detach())

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.inference_mode()
def last_vectors(loaded: LoadedModel, batches) -> tuple[Tensor, Tensor]:
    """h at every scored position (labels != -100) and those labels: ``([N, d] float32, [N])``."""
    module, output, *_ = output_layer(loaded)
    hs, ys = [], []
    for b in batches:
        store: list[Tensor] = []
        labels = b["labels"]
        sel = labels != -100
        with _capture(module, output, store):  # a Hugging Face head projects the scored rows alone
            loaded.forward(b["input_ids"], b["attention_mask"], rows=sel)
        h = store[-1].float().cpu()
        if h.shape[:-1] == labels.shape:  # [B, T, d]: a head that saw every position
            h = h[sel]
        elif h.shape[:-1] != (int(sel.sum()),):  # [n, d]: the scored rows (LoadedModel.forward's rows)
            raise ValueError(f"unexpected output-layer input shape {tuple(h.shape)} for labels {tuple(labels.shape)}")
        hs.append(h)
        ys.append(labels[sel])
    if not hs or sum(x.shape[0] for x in hs) == 0:
        raise ValueError("no scored position: the texts are too short or mlm_probability is 0")
    return torch.cat(hs), torch.cat(ys)


# ------------------------------------------------------------------------------- the report's example sentence
@torch.inference_mode()
def fill_mask(loaded: LoadedModel, text: str, top_k: int = 5) -> list[tuple[str, float]]:
    """Top-``k`` predictions (token, probability) for the first ``{mask}`` (or mask token) in ``text``."""
    tok = loaded.tokenizer
    text = text.replace("{mask}", tok.mask_token)
    enc = tok(text, return_tensors="pt", truncation=True, max_length=loaded.max_length)
    where = (enc["input_ids"][0] == tok.mask_token_id).nonzero().flatten()
    if where.numel() == 0:
        raise ValueError(f"example sentence {text!r} has no {{mask}} placeholder")
    logits = loaded.forward(enc["input_ids"], enc["attention_mask"]).logits[0, int(where[0])]
    probs, ids = logits.float().softmax(-1).topk(top_k)
    return [(tok.decode([int(i)]).strip(), float(p)) for p, i in zip(probs, ids)]


@torch.inference_mode()
def predict_next(loaded, text: str, top_k: int = 5) -> list[tuple[str, float]]:
    """Top-``k`` next tokens (token, probability) after the part of ``text`` before ``{mask}`` (the whole
    text when it has none), trailing special tokens (e.g. ``[SEP]``) removed from the prompt."""
    tok = loaded.tokenizer
    prefix = text.split("{mask}")[0].split(tok.mask_token)[0] if tok.mask_token else text.split("{mask}")[0]
    ids = tok(prefix.rstrip(), truncation=True, max_length=loaded.max_length)["input_ids"]
    special = set(tok.all_special_ids)
    while len(ids) > 1 and ids[-1] in special:
        ids = ids[:-1]
    if not ids:
        raise ValueError(f"example sentence {text!r} gives an empty prompt")
    x = torch.tensor([ids])
    logits = loaded.forward(x, torch.ones_like(x)).logits[0, -1]
    probs, top = logits.float().softmax(-1).topk(top_k)
    return [(tok.decode([int(i)]).strip(), float(p)) for p, i in zip(probs, top)]
