"""The Luo-type outlier dimension, defined once (docs/design.md, "Luo-type dimension").

Luo, Kulmizev & Mao (2021) find in BERT and RoBERTa one hidden dimension holding the largest value of most tokens'
vectors in most layers (RoBERTa-base's 588, BERT-base's 308).  From the monitors' per-layer ``abs_argmax_share`` rows:

    a checkpoint has a Luo-type dimension d when d is the |x| argmax of at least ``share`` (0.5) of the tokens
    in at least ``layer_fraction`` (half) of the encoder layers (layer_1 .. layer_L, not the embedding output).

One layer alone, or different dimensions in different layers, do not count.  The weakest form of Luo et al.'s picture
(with 4 layers, two at 0.5 meet it); ``luo_by_step`` gives how strong and lasting it is.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Mapping

#: Defaults of the definition (module docstring).
SHARE, LAYER_FRACTION = 0.5, 0.5


def luo_dimension(by_layer: Mapping[int, tuple[int, float]], num_layers: int, share: float = SHARE,
                  layer_fraction: float = LAYER_FRACTION) -> tuple[int, int] | None:
    """``(dim, n_layers)`` of the Luo-type dimension at one step, or None.

    ``by_layer``: encoder layer i (1..L) -> (its |x| argmax dimension, that dimension's share of tokens).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    held = Counter(dim for layer, (dim, value) in by_layer.items() if 1 <= layer <= num_layers and value >= share)
    if not held:
        return None
    dim, n = held.most_common(1)[0]
    return (int(dim), int(n)) if n >= math.ceil(layer_fraction * num_layers) else None


def luo_by_step(rows: Iterable[tuple[int, int, int, float]], num_layers: int, share: float = SHARE,
                layer_fraction: float = LAYER_FRACTION) -> dict[int, tuple[int, int, float] | None]:
    """Every step's Luo-type dimension, from ``(step, layer, dim, share)`` rows, in step order: ``(dim, n_layers,
    mean share over the layers where it holds at least ``share``)`` or None."""
    steps: dict[int, dict[int, tuple[int, float]]] = {}
    for step, layer, dim, value in rows:
        steps.setdefault(int(step), {})[int(layer)] = (int(dim), float(value))
    out: dict[int, tuple[int, int, float] | None] = {}
    for step in sorted(steps):
        found = luo_dimension(steps[step], num_layers, share, layer_fraction)
        if found is not None:
            held = [v for layer, (d, v) in steps[step].items() if 1 <= layer <= num_layers and d == found[0]
                    and v >= share]
            found = (found[0], found[1], sum(held) / len(held))
        out[step] = found
    return out
