"""W8A8 fake quantization of a model's linear layers, for as long as a ``with`` block lasts.

Bondarenko et al. (2023, "Quantizable Transformers") measure what outlier dimensions cost as the loss of a model whose
linears compute in 8 bits (input per tensor, symmetric absmax, dynamic; weight per output channel); Dettmers et al.
(2022, "LLM.int8()") keep the few outlier input dims in 16 bits and the damage goes away.  ``quantized`` applies both to
the transformer blocks' linears only (embeddings and LM head stay full precision), with
``outlierlab.metrics.fake_quant``'s arithmetic: the inputs are rounded by hooks at the named sites every block linear
reads (``outlierlab.models.hook_points.LINEAR_INPUT_SITES``: ``attn.in``, ``attn.z``, ``ffn.in``, ``ffn.post``), the
weights -- parameters, not activations -- by ``rounded_weights``, which restores them exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from outlierlab.metrics.fake_quant import fake_quantize, fake_quantize_weight, largest_dims
from outlierlab.models.hook_points import LINEAR_INPUT_SITES, HookPoint, Site, attached, model_family, site_table

__all__ = ["linear_layers", "linear_input_sites", "site_linears", "quantized", "rounded_weights", "KeptDims",
           "w8a8_cost"]


def _is_linear(module: nn.Module) -> bool:
    """``nn.Linear``, or transformers' ``Conv1D`` (GPT-2's linear layers, weight stored ``(in, out)``)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def linear_layers(model: nn.Module, blocks: Sequence[int] | None = None) -> dict[str, nn.Module]:
    """``{"<block>.<path>": module}``: every linear layer of the transformer blocks (numbered from 1, as hidden states:
    block i produces hidden state i), found by type, not by site; ``blocks`` keeps only those blocks."""
    out = {}
    for i, block in enumerate(model_family(model).block_list(model), start=1):
        if blocks is not None and i not in blocks:
            continue
        out.update({f"{i}.{name}": m for name, m in block.named_modules() if _is_linear(m)})
    if not out:
        raise ValueError(f"no linear layer found in the blocks {list(blocks) if blocks else ''} of "
                         f"{type(model).__name__}")
    return out


def linear_input_sites(model: nn.Module, blocks: Sequence[int] | None = None,
                       table: dict[str, Site] | None = None) -> dict[str, Site]:
    """The sites of ``LINEAR_INPUT_SITES`` in ``blocks`` (None: all), which together feed every linear layer of
    ``linear_layers``; a block linear that reads no site is refused in one line (quantizing fewer layers than the
    model has would understate the cost)."""
    table = site_table(model) if table is None else table
    sites = {n: s for n, s in table.items() if n.split(".", 2)[-1] in LINEAR_INPUT_SITES
             and (blocks is None or s.layer in blocks)}
    reached = {id(m) for m in site_linears(sites.values())}
    missing = [name for name, m in linear_layers(model, blocks).items() if id(m) not in reached]
    if missing:
        raise ValueError(f"the linear layers {', '.join(missing)} of {type(model).__name__} read no named site "
                         f"({', '.join(LINEAR_INPUT_SITES)}): add their paths to its family in "
                         "outlierlab/models/families.py")
    return sites


def site_linears(sites: Iterable[Site]) -> list[nn.Module]:
    """The linear layers at ``sites``: each site's modules, or the linears inside one that wraps them (an adapter
    such as PEFT's LoRA, whose base layer and ``lora_A`` read the site; ``lora_B`` reads ``lora_A``'s rank-r output,
    which no site names, so only its weight is rounded)."""
    return [sub for s in sites for m in (s.module, *s.also) for sub in m.modules() if _is_linear(sub)]


class KeptDims(Counter):
    """How often each input dimension was among the ``k`` kept in full precision (one count per linear layer's
    quantized input): whether the dimensions LLM.int8() would keep are the model's outlier dimensions."""

    inputs: int = 0

    def top(self, n: int = 5) -> list[tuple[int, float]]:
        """The ``n`` dimensions kept most often, with the share of quantized inputs they were kept in."""
        return [(int(d), c / max(self.inputs, 1)) for d, c in self.most_common(n)]


@contextmanager
def rounded_weights(modules: Sequence[nn.Module], bits: int = 8) -> Iterator[None]:
    """Within the block, each linear layer of ``modules`` has its weight rounded per output channel to ``bits`` bits;
    the weights are restored exactly on exit, also after an error."""
    saved = []
    try:
        with torch.no_grad():
            for module in {id(m): m for m in modules}.values():  # once each: restored in one pass
                w = module.weight
                saved.append((w, w.detach().clone()))
                # Conv1D stores (in, out): its output channels are columns
                w.copy_(fake_quantize_weight(w.t(), bits).t() if type(module).__name__ == "Conv1D" else
                        fake_quantize_weight(w, bits))
        yield
    finally:
        with torch.no_grad():
            for w, original in saved:
                w.copy_(original)


def _input_rounding(bits: int, keep: int, kept: KeptDims | None):
    """The hook rounding a linear layer's input per tensor; ``keep`` largest-|x| dims left in full precision."""

    def hook(x: Tensor, point: HookPoint) -> Tensor:
        dims = largest_dims(x, keep) if keep > 0 else None
        if kept is not None and dims is not None:
            kept.update(dims.tolist())
            kept.inputs += 1
        return fake_quantize(x, bits, keep=dims)

    return hook


@contextmanager
def quantized(model: nn.Module, blocks: Sequence[int] | None = None, bits: int = 8, keep: int = 0,
              kept: KeptDims | None = None) -> Iterator[None]:
    """Within the block, every linear layer of ``blocks`` (None: all; numbered from 1) computes with its weight rounded
    per output channel and its input rounded per tensor to ``bits`` bits; ``keep`` > 0 leaves that many largest-|x|
    input dimensions of every input in full precision (chosen per input tensor, dynamically, as LLM.int8() does).
    ``kept`` counts which dims were kept, once per linear layer.  The weights are restored exactly on exit, also after
    an error."""
    sites = linear_input_sites(model, blocks)
    hook = _input_rounding(bits, keep, kept)
    with rounded_weights(site_linears(sites.values()), bits), \
            attached(model, {name: hook for name in sites}):
        yield


def _scored_logits(model: nn.Module, problem: dict, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits ``[n, V]`` at the scored tokens of ``problem`` and their targets ``[n]``: the labelled positions of a
    masked problem (a Hugging Face head narrowed to them by ``logits_at``; ours called with its labels, which runs
    its head there alone), or every next token of a causal one."""
    from outlierlab.metrics.scored_rows import logits_at

    labels = problem["labels"]
    if causal:
        logits = model(input_ids=problem["input_ids"], attention_mask=problem["attention_mask"]).logits
        keep = labels[:, 1:] != -100
        return logits[:, :-1][keep], labels[:, 1:][keep]
    keep = labels != -100
    with logits_at(model, keep) as narrowed:
        out = model(input_ids=problem["input_ids"], attention_mask=problem["attention_mask"],
                    **({} if narrowed else {"labels": labels}))
    logits = out.logits
    return (logits[keep] if logits.ndim == 3 else logits), labels[keep]


def w8a8_cost(model: nn.Module, batch: dict, causal: bool, mask_token_id: int | None, keep: int = 4,
              bits: int = 8) -> dict[str, float]:
    """What 8 bits cost the model on the monitors' fixed held-out batch, for a live curve.

    On ``word_order.heldout_problem`` with all block linears in W8A8: ``loss_delta`` (nats per token) and ``kl`` (mean
    KL of the predictions from full precision, >= 0: the damage itself); ``keep_loss_delta``/``keep_kl`` with ``keep``
    largest-|x| input dims in full precision.  A model without logits gets ``rel_error``/``keep_rel_error`` of its last
    hidden states.
    """
    from outlierlab.metrics.word_order import heldout_problem

    device = next(model.parameters()).device
    mask = batch["attention_mask"]
    linear_input_sites(model)  # a model whose linears cannot all be quantized: refused here, whatever its head
    try:
        problem = {k: v.to(device) for k, v in heldout_problem(batch, causal, mask_token_id).items()}
        with torch.inference_mode():
            ref, y = _scored_logits(model, problem, causal)
            ref_logp = ref.float().log_softmax(-1)
            base = float(torch.nn.functional.nll_loss(ref_logp, y))
            out = {}
            for prefix, k in (("", 0), ("keep_", keep)):
                with quantized(model, bits=bits, keep=k):
                    logp = _scored_logits(model, problem, causal)[0].float().log_softmax(-1)
                out[f"{prefix}loss_delta"] = float(torch.nn.functional.nll_loss(logp, y)) - base
                out[f"{prefix}kl"] = float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean())
        return out
    except (TypeError, AttributeError, ValueError):  # no logits: the last hidden states' relative error
        ids, m = batch["input_ids"].to(device), mask.to(device)

        def last() -> torch.Tensor:
            h = model(input_ids=ids, attention_mask=m, output_hidden_states=True).hidden_states[-1]
            return h[m.bool()].float()

        with torch.inference_mode():
            ref = last()
            with quantized(model, bits=bits):
                q = last()
            with quantized(model, bits=bits, keep=keep):
                qk = last()
        norm = float(ref.norm()) or 1.0
        return {"rel_error": float((q - ref).norm()) / norm, "keep_rel_error": float((qk - ref).norm()) / norm}
