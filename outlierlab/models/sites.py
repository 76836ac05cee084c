"""The inf-norm of every block's activations at Bondarenko et al.'s (2023) sites, read through the named sites.

Bondarenko, Nagel & Blankevoort (2023, "Quantizable Transformers: Removing Outliers by Helping Attention
Heads Do Nothing", NeurIPS 2023) report the inf-norm ‖x‖∞ = max |x| of BERT activations at the FFN output
and around the output LayerNorm; users of their code could not tell which tensor a number referred to,
so here every value is tagged by its site, under the names the monitors' histories carry, each one a site of
``outlierlab.models.hook_points.site_table`` (``monitor_sites``):

* ``ffn_output`` — ``blocks.{i}.ffn.out``: the FFN down-projection's output, before dropout and the residual add;
* ``ln_input`` — post-LN: ``blocks.{i}.ln_ffn.in``, residual + FFN output, the input of the block's output
  LayerNorm; pre-LN, reordered-norm and Outlier-Protected blocks: ``blocks.{i}.resid``, the block output (the sum a
  post-LN block would normalise; no norm there writes the stream);
* ``ln_output`` — post-LN only: ``blocks.{i}.ln_ffn``, that LayerNorm's output (= the block's output);
* ``residual`` — ``blocks.{i}.resid``: the stream the block hands on.

A model without a site table (an unregistered ``model_type``) is refused in one line naming how to register it.
Layers are numbered like hidden states: block i (1-based) produces hidden state i; hidden state 0 is the
embedding output, which has no sites.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import nullcontext

import torch
from torch import Tensor, nn

from outlierlab.models.hook_points import Site, attached, model_family, site_table
from outlierlab.models.placement import eager_attention

__all__ = ["SITE_NAMES", "monitor_sites", "InfNormRecorder", "eager_attention", "monitored_forward"]

#: The sites recorded by default (Bondarenko et al. 2023).
SITE_NAMES = ("ffn_output", "ln_input", "ln_output")


def monitor_sites(model: nn.Module, table: dict[str, Site] | None = None) -> dict[tuple[str, int], str]:
    """``{(monitor site, layer): named site}`` for every block of ``model`` (see the module docstring); a site a
    block lacks is absent (an Outlier-Protected block's ``ln_output``)."""
    table = site_table(model) if table is None else table
    post = model_family(model).placement == "post"
    out = {}
    for layer in sorted({s.layer for n, s in table.items() if n.startswith("blocks.")}):
        p = f"blocks.{layer}."
        normed = post and p + "ln_ffn" in table  # a post-LN block's output norm writes the stream
        names = {"ffn_output": "ffn.out", "ln_input": "ln_ffn.in" if normed else "resid",
                 "ln_output": "ln_ffn" if normed else None, "residual": "resid"}
        out.update({(key, layer): p + site for key, site in names.items() if site and p + site in table})
    return out


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
        self.model, self.sites = model, tuple(sites)
        self.table = site_table(model)
        self.where = {key: name for key, name in monitor_sites(model, self.table).items() if key[0] in self.sites}
        n_blocks = sum(n.endswith(".resid") for n in self.table)
        self.max = {s: torch.full((n_blocks + 1,), math.nan, dtype=torch.float64) for s in self.sites}
        self._pending: dict[tuple[str, int], Tensor] = {}
        self._hooks = None

    # -- hooks: readers at the named sites, which leave every activation as it is ----------------------
    def _store(self, key: tuple[str, int], x: Tensor) -> None:
        self._pending[key] = x.detach().abs().amax(-1).to(torch.float64)

    def __enter__(self) -> "InfNormRecorder":
        readers: dict[str, list] = {}
        for key, name in self.where.items():
            readers.setdefault(name, []).append(lambda x, point, key=key: self._store(key, x))
        self._hooks = attached(self.model, readers, self.table)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None
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
