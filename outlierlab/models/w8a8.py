"""W8A8 fake quantization of a model's linear layers, for as long as a ``with`` block lasts.

Bondarenko et al. (2023, "Quantizable Transformers") measure what outlier dimensions cost as the loss of a model whose
linear layers compute in 8 bits: each layer's input quantized per tensor (symmetric absmax, dynamic) and its weight
per output channel. Dettmers et al. (2022, "LLM.int8()") keep the few outlier input dimensions in 16 bits and the
damage goes away. ``quantized`` applies both to the linear layers of the transformer blocks -- where the
residual stream and its outlier dimensions enter every matrix -- and leaves embeddings and the LM head in full
precision, so the cost it measures is the blocks'. The arithmetic is ``outlierlab.analysis.fake_quant``'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from outlierlab.analysis.fake_quant import fake_quantize, fake_quantize_weight, largest_dims
from outlierlab.models.sites import encoder_blocks

__all__ = ["linear_layers", "quantized", "KeptDims"]


def _is_linear(module: nn.Module) -> bool:
    """``nn.Linear``, or transformers' ``Conv1D`` (GPT-2's linear layers, weight stored ``(in, out)``)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def linear_layers(model: nn.Module, blocks: Sequence[int] | None = None) -> dict[str, nn.Module]:
    """``{"<block>.<path>": module}``: the linear layers of the transformer blocks (numbered from 1, as hidden states:
    block i produces hidden state i); ``blocks`` keeps only those blocks."""
    out = {}
    for i, block in enumerate(encoder_blocks(model), start=1):
        if blocks is not None and i not in blocks:
            continue
        out.update({f"{i}.{name}": m for name, m in block.named_modules() if _is_linear(m)})
    if not out:
        raise ValueError(f"no linear layer found in the blocks {list(blocks) if blocks else ''} of "
                         f"{type(model).__name__}")
    return out


class KeptDims(Counter):
    """How often each input dimension was among the ``k`` kept in full precision (one count per quantized input
    tensor): whether the dimensions LLM.int8() would keep are the model's outlier dimensions."""

    inputs: int = 0

    def top(self, n: int = 5) -> list[tuple[int, float]]:
        """The ``n`` dimensions kept most often, with the share of quantized inputs they were kept in."""
        return [(int(d), c / max(self.inputs, 1)) for d, c in self.most_common(n)]


@contextmanager
def quantized(layers: dict[str, nn.Module], bits: int = 8, keep: int = 0,
              kept: KeptDims | None = None) -> Iterator[None]:
    """Within the block, every layer in ``layers`` computes with its weight rounded per output channel and its input
    rounded per tensor to ``bits`` bits; ``keep`` > 0 leaves that many largest-|x| input dimensions of every input in
    full precision (chosen per input tensor, dynamically, as LLM.int8() does). ``kept`` counts which dims were kept.
    The weights are restored exactly on exit, also after an error."""
    saved, handles = {}, []

    def quantize_input(module, args):
        x = args[0]
        dims = largest_dims(x, keep) if keep > 0 else None
        if kept is not None and dims is not None:
            kept.update(dims.tolist())
            kept.inputs += 1
        return (fake_quantize(x, bits, keep=dims), *args[1:])

    try:
        with torch.no_grad():
            for name, module in layers.items():
                saved[name] = module.weight.detach().clone()
                w = module.weight
                # Conv1D stores (in, out): its output channels are columns
                q = fake_quantize_weight(w.t(), bits).t() if type(module).__name__ == "Conv1D" else \
                    fake_quantize_weight(w, bits)
                w.copy_(q)
                handles.append(module.register_forward_pre_hook(quantize_input))
        yield
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for name, w in saved.items():
                layers[name].weight.copy_(w)
