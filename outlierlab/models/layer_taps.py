"""Every layer's hidden states handed over one at a time, as the forward pass produces them.

``output_hidden_states=True`` keeps all ``L+1`` states until the forward returns, and stacking them as float32 costs
``(L+1)·B·T·d·4`` bytes per batch (≈ 22 GB at 70B, 16 × 512 tokens).  ``tap_layers`` reads them at their named sites
(``models.hook_points``: ``embed``, ``blocks.{i}.resid``) and calls ``fn(layer, hidden)`` with each ``[B, T, d]`` in the
model's dtype, so activation memory stays at about one layer's batch.

The layers are ``output_hidden_states``' (tests/test_one_pass.py, tests/test_sites.py): 0 the embedding output, ``i``
block ``i``'s output, the last one ``last_hidden_state`` — after the final norm where Hugging Face applies it (GPT-2,
GPT-NeoX, Llama, Qwen2, ModernBERT, our pre-LN encoder; site ``ln_final``).  A model whose blocks the registry cannot
name falls back to ``output_hidden_states`` (never stacked).
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

LayerFn = Callable[[int, Tensor], None]


def tap_layers(model: nn.Module, call: Callable[[bool], object], fn: LayerFn) -> int:
    """Run ``call(output_hidden_states)`` once and feed layers 0..L in order to ``fn(layer, hidden [B, T, d])``, in the
    model's dtype on the producing device; returns the number delivered (L+1).  ``model`` is the module whose family
    blocks are hooked; ``call``'s output has ``last_hidden_state`` (and ``hidden_states`` when asked)."""
    from outlierlab.models.hook_points import attached, site_table

    try:
        table = site_table(model)
    except ValueError:  # not registered, no block list, or a config naming no attention heads: read the states whole
        table = None
    if table is None:
        out = call(True)
        hidden = getattr(out, "hidden_states", None)
        if hidden is None:
            raise ValueError(f"{type(model).__name__} returned no hidden_states; it is not an encoder AutoModel supports")
        for i, h in enumerate(hidden):
            fn(i, h)
        return len(hidden)

    def reader(layer: int):
        def read(x, _point):
            fn(layer, x)  # returns None: the activation goes on unchanged
        return read

    blocks = [name for name in table if name.endswith(".resid")]
    # the last block's output is not a hidden state where a final norm follows: last_hidden_state is, below
    hooks = {"embed": reader(0), **{name: reader(i) for i, name in enumerate(blocks[:-1], start=1)}}
    with attached(model, hooks, table):
        out = call(False)
    fn(len(blocks), out.last_hidden_state)
    return len(blocks) + 1
