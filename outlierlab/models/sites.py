"""Named activation sites inside each encoder block, and the inf-norm recorded there by forward hooks.

Bondarenko, Nagel & Blankevoort (2023, "Quantizable Transformers: Removing Outliers by Helping Attention
Heads Do Nothing", NeurIPS 2023) report the inf-norm ‖x‖∞ = max |x| of BERT activations at the FFN output
and around the output LayerNorm; users of their code could not tell which tensor a number referred to,
so here every value is tagged by its site:

* ``ffn_output`` — the FFN down-projection's output, before dropout and the residual add;
* ``ln_input`` — residual + FFN output, the input of the block's output LayerNorm (a forward pre-hook);
* ``ln_output`` — that LayerNorm's output (= the block's output in a post-LN block);
* ``residual`` — the stream the block hands on (our encoder only).

Where the sites are: a block's own ``sites()`` method (``{name: (module, "input" | "output")}``: our
``outlierlab.models.blocks.Layer`` and ``OPLayer``, which omit the sites they lack), else its family's
(``outlierlab.models.family_spec.Family.sites``), else BERT/RoBERTa and DistilBERT module names (``block_sites``).

Layers are numbered like hidden states: block i (1-based) produces hidden state i; hidden state 0 is the
embedding output, which has no sites.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import nullcontext

import torch
from torch import Tensor, nn

from outlierlab.models.families import UnknownFamilyError, family_of
from outlierlab.models.placement import eager_attention

__all__ = ["SITE_NAMES", "encoder_blocks", "block_sites", "InfNormRecorder", "eager_attention", "monitored_forward"]

#: The sites recorded by default (Bondarenko et al. 2023).
SITE_NAMES = ("ffn_output", "ln_input", "ln_output")

# Hugging Face fallbacks: (site, dotted module path inside the block, "input" | "output").
_HF_SITES = (
    (("ffn_output", "output.dense", "output"), ("ln_input", "output.LayerNorm", "input"),
     ("ln_output", "output.LayerNorm", "output")),  # BertLayer, RobertaLayer, ...
    (("ffn_output", "ffn.lin2", "output"), ("ln_input", "output_layer_norm", "input"),
     ("ln_output", "output_layer_norm", "output")),  # DistilBERT TransformerBlock
)
_BLOCK_LISTS = ("roberta.encoder.layer", "encoder.layer", "transformer.layer", "bert.encoder.layer",
                "distilbert.transformer.layer")


def _family(model: nn.Module):
    try:
        return family_of(model)
    except UnknownFamilyError:
        return None


def encoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks in depth order (ours, a registered Hugging Face family, else BERT/DistilBERT-style names;
    with or without the LM head)."""
    family = _family(model)
    if family is not None:
        return family.block_list(model)
    for path in _BLOCK_LISTS:
        mod = model
        try:
            for part in path.split("."):
                mod = getattr(mod, part)
        except AttributeError:
            continue
        if isinstance(mod, nn.ModuleList) and len(mod):
            return list(mod)
    raise ValueError(f"cannot find the encoder blocks of {type(model).__name__}: expected a ModuleList at one of "
                     f"{', '.join(_BLOCK_LISTS)}")


def block_sites(block: nn.Module, family=None) -> dict[str, tuple[nn.Module, str]]:
    """``{site: (module, "input" | "output")}`` of one block: its own ``sites()``, its family's
    (``outlierlab.models.family_spec.Family.sites``), else the HF BERT/DistilBERT names."""
    if callable(getattr(block, "sites", None)):
        return dict(block.sites())
    if family is not None:
        return family.sites(block)
    for table in _HF_SITES:
        found = {}
        for site, path, kind in table:
            try:
                found[site] = (block.get_submodule(path), kind)
            except AttributeError:
                break
        else:
            return found
    raise ValueError(f"block {type(block).__name__} has no sites() method and no known FFN/LayerNorm module "
                     "names (output.dense/output.LayerNorm or ffn.lin2/output_layer_norm); give it a sites() "
                     "method returning {name: (module, 'input'|'output')}")


class InfNormRecorder:
    r"""Context manager: forward hooks that record ‖x‖∞ = max |x| at every block's named sites.

    .. math:: \text{inf\_norm}_{s,l} = \max_{(b,t) \in \text{mask}} \max_i |x^{(s,l)}_{b,t,i}|

    Hooks only reduce each activation to its per-token max ``[B, T]`` (cheap, nothing of size d is kept);
    ``commit`` then applies the token mask of that forward pass and updates the running maxima, so the
    same recorder serves one batch (the monitor) or a stream of batches (``evaluate.py``).  Call
    ``commit`` after every forward pass made inside the context.

    ``model``: ours (``RobertaMaskedLM``, ``RobertaEncoder``) or a Hugging Face encoder or decoder; ``sites``: the
    site names to record (default ``SITE_NAMES``); a site a block lacks gives NaN for that layer.

    Examples
    --------
    >>> with InfNormRecorder(model) as rec:                     # doctest: +SKIP
    ...     model(ids, attention_mask=mask)
    ...     rec.commit(mask.bool())
    >>> rec.result()["ffn_output"]                              # Tensor[L+1]; [0] (embeddings) is NaN
    """

    def __init__(self, model: nn.Module, sites: Iterable[str] = SITE_NAMES) -> None:
        self.blocks = encoder_blocks(model)
        self.sites = tuple(sites)
        family = _family(model)
        per_block = [block_sites(b, family) for b in self.blocks]
        self.where = {(s, i + 1): bs[s] for i, bs in enumerate(per_block) for s in self.sites if s in bs}
        self.max = {s: torch.full((len(self.blocks) + 1,), math.nan, dtype=torch.float64) for s in self.sites}
        self._pending: dict[tuple[str, int], Tensor] = {}
        self._handles: list = []

    # -- hooks -----------------------------------------------------------------------------------------
    def _store(self, key: tuple[str, int], x) -> None:
        if isinstance(x, tuple):  # some HF modules return tuples; the activation is the first element
            x = x[0]
        self._pending[key] = x.detach().abs().amax(-1).to(torch.float64)

    def __enter__(self) -> "InfNormRecorder":
        for key, (module, kind) in self.where.items():
            if kind == "input":
                h = module.register_forward_pre_hook(lambda m, args, key=key: self._store(key, args[0]))
            elif kind == "output":
                h = module.register_forward_hook(lambda m, args, out, key=key: self._store(key, out))
            else:
                raise ValueError(f"site {key[0]} of layer {key[1]}: kind must be 'input' or 'output', got {kind!r}")
            self._handles.append(h)
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._pending.clear()

    # -- reduction -------------------------------------------------------------------------------------
    def commit(self, mask: Tensor) -> None:
        """Reduce the last forward pass over the tokens in ``mask`` ([B, T] bool) into the running maxima."""
        if not self._pending:
            raise RuntimeError("InfNormRecorder.commit(): no forward pass was recorded since the last commit "
                               "(run the model inside the `with` block)")
        for (site, layer), per_token in self._pending.items():
            if tuple(per_token.shape) != tuple(mask.shape):
                raise ValueError(f"mask {tuple(mask.shape)} does not match the activations {tuple(per_token.shape)}")
            sel = per_token[mask.to(per_token.device).bool()]
            if sel.numel():
                cur = self.max[site][layer]
                self.max[site][layer] = float(sel.max()) if math.isnan(cur) else max(float(cur), float(sel.max()))
        self._pending.clear()

    def result(self) -> dict[str, Tensor]:
        """``{site: Tensor[L+1]}`` float64, index = hidden-state layer (0 and missing sites: NaN)."""
        return {s: v.clone() for s, v in self.max.items()}


def monitored_forward(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, attentions: bool = True,
                      sites: Iterable[str] = SITE_NAMES) -> tuple[Tensor, Tensor | None, dict[str, Tensor]]:
    """One forward pass of the encoder body giving everything the outlier monitors read.

    Runs ``model.roberta`` for our ``RobertaMaskedLM`` (the MLM head is not needed) or ``model`` itself
    (our ``RobertaEncoder``, or a Hugging Face encoder loaded with eager attention) with hidden states and
    attention probabilities, inside an ``InfNormRecorder`` committed over the non-pad tokens — special
    tokens included, because Bondarenko et al. (2023) find BERT's largest activations on ``[SEP]`` and
    punctuation.  A Hugging Face model running ``sdpa`` is switched to eager attention for this pass only
    (``eager_attention``).  The caller chooses eval mode and ``torch.inference_mode()``.  Returns ``hidden``
    ``[L+1, B, T, d]`` (layer 0: the embedding output), ``attn`` ``[L, B, H, T, T]`` (None with ``attentions=False``)
    and ``inf_norms`` ``{site: Tensor[L+1]}`` (``InfNormRecorder.result``).
    """
    body = getattr(model, "roberta", model)
    with (eager_attention(model) if attentions else nullcontext()), InfNormRecorder(body, sites) as rec:
        if hasattr(model, "roberta"):
            out = body(input_ids, attention_mask, output_hidden_states=True, output_attentions=attentions)
        else:
            out = body(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                       output_attentions=attentions)
        rec.commit(attention_mask.bool())
    attn = None
    if attentions:
        if not out.attentions or out.attentions[0] is None:
            raise ValueError(f"{type(model).__name__} returned no attention probabilities (needs eager attention)")
        attn = torch.stack(tuple(out.attentions))
    return torch.stack(tuple(out.hidden_states)), attn, rec.result()
