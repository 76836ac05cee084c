"""Every layer's hidden states handed over one at a time, as the forward pass produces them.

``output_hidden_states=True`` keeps all ``L+1`` hidden states until the forward returns, and stacking them
as float32 (what ``outlierlab.models.loading.FrozenEncoder.forward`` returns) costs ``(L+1)·B·T·d·4``
bytes per batch — ≈ 22 GB for a 70B model (81 × 8192) at 16 × 512 tokens.  ``tap_layers`` registers
forward hooks on the family's blocks (``outlierlab.models.families``) and calls ``fn(layer, hidden)`` with
each layer's ``[B, T, d]`` output in the model's dtype; the caller reduces it into its accumulators (which
upcast) and drops it, so activation memory stays at about one layer's batch.

The layers are those of ``output_hidden_states`` (checked per family in tests/test_one_pass.py):
layer 0 is the input of the first block (the embedding output), layer ``i`` the output of block ``i-1``,
and the last one the model's ``last_hidden_state`` — after the final norm where Hugging Face applies it to
the last hidden state (GPT-2, GPT-NeoX, Llama, Qwen2, ModernBERT and our pre-LN encoder).
A model whose blocks the registry cannot name falls back to ``output_hidden_states`` (every layer kept
until the forward returns, never stacked).
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

LayerFn = Callable[[int, Tensor], None]


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def block_list_or_none(model: nn.Module) -> list[nn.Module] | None:
    """The family's blocks of ``model`` in depth order, or None when the registry does not know it."""
    from outlierlab.models.families import UnknownFamilyError, family_of

    try:
        return family_of(model).block_list(model)
    except (UnknownFamilyError, ValueError):
        return None


def tap_layers(model: nn.Module, call: Callable[[bool], object], fn: LayerFn) -> int:
    """Run ``call(output_hidden_states)`` once and feed every layer to ``fn(layer, hidden [B, T, d])``.

    Parameters
    ----------
    model : the module whose family blocks are hooked (a Hugging Face ``AutoModel`` or our masked LM)
    call : runs the forward; its argument says whether to ask for ``output_hidden_states``; returns an
        output with ``last_hidden_state`` (and ``hidden_states`` when asked)
    fn : receives layers 0..L in order, each in the model's dtype on the device that produced it

    Returns
    -------
    int : the number of hidden states delivered (L+1)
    """
    blocks = block_list_or_none(model)
    if blocks is None:
        out = call(True)
        hidden = getattr(out, "hidden_states", None)
        if hidden is None:
            raise ValueError(f"{type(model).__name__} returned no hidden_states; it is not an encoder AutoModel supports")
        for i, h in enumerate(hidden):
            fn(i, h)
        return len(hidden)

    def pre(_mod, args, kwargs):
        fn(0, args[0] if args else kwargs["hidden_states"])

    handles = [blocks[0].register_forward_pre_hook(pre, with_kwargs=True)]
    for i, block in enumerate(blocks[:-1]):  # the last block's output: last_hidden_state (after a final norm)
        handles.append(block.register_forward_hook(lambda _m, _a, out, i=i: fn(i + 1, _first(out))))
    try:
        out = call(False)
    finally:
        for h in handles:
            h.remove()
    fn(len(blocks), out.last_hidden_state)
    return len(blocks) + 1
