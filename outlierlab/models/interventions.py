"""Ready-made hooks for named sites (``outlierlab.models.hook_points``, ``ol.run_with_hooks``): each function
returns a hook ``fn(activation, point) -> Tensor`` that leaves the input unchanged and returns a new tensor.

``dims`` selects indices of the last axis (the hidden dimensions; of a pattern, the keys), ``positions`` token
positions (of a pattern, the queries); None: all of them.  Positions count the tokens of each text from 0 (``<s>`` /
``[CLS]``), as ``outlierlab.models.activation_cache.ActivationCache.positions`` does.

* ``zero`` — set to 0 (Kovaleva et al. 2021 zero a LayerNorm dimension's gain and bias, the same output);
* ``mean`` — set to the dimension's mean over a corpus (Sun et al. 2024, "Massive Activations in Large Language
  Models", §3: setting the massive activations to their mean values leaves the model intact where zeroing them
  destroys it);
* ``clip`` — clamp to a range (Wei et al. 2022's clipping of outlier activations, "Outlier Suppression");
* ``scale`` — multiply;
* ``quantize`` — symmetric absmax fake quantization per tensor, the activations' side of W8A8 (Bondarenko et al.
  2023; Dettmers et al. 2022, LLM.int8()), by ``outlierlab.metrics.fake_quant.fake_quantize``;
* ``patch`` — replace by the activation of another run (activation patching: Vig et al. 2020; Meng et al. 2022;
  Heimersheim & Nanda 2024).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from outlierlab.metrics.fake_quant import fake_quantize

__all__ = ["Intervention", "zero", "mean", "clip", "scale", "quantize", "patch"]


class Intervention:
    """A hook with a name for tables and reprs (``zero(dims=[588])``)."""

    def __init__(self, label: str, fn: Callable[[Tensor, object], Tensor]) -> None:
        self.label, self.fn = label, fn

    def __call__(self, x: Tensor, point) -> Tensor:
        return self.fn(x, point)

    def __repr__(self) -> str:
        return self.label


def _ints(name: str, values) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, numbers.Integral) and not isinstance(values, bool):
        values = [values]
    try:
        out = [int(v) for v in (values.tolist() if isinstance(values, Tensor) else values)]
    except (TypeError, ValueError):
        raise TypeError(f"{name}={values!r}: pass a list of integers, or None for all") from None
    if not out:
        raise ValueError(f"{name} is empty: pass at least one index, or None for all")
    return out


def _where(x: Tensor, point, dims: list[int] | None, positions: list[int] | None) -> Tensor | None:
    """The entries of ``x`` to change (a bool mask broadcasting to ``x``), or None for all of them."""
    if dims is None and positions is None:
        return None
    mask = torch.ones((), dtype=torch.bool, device=x.device)
    if dims is not None:
        size = x.shape[-1]
        bad = [d for d in dims if not -size <= d < size]
        if bad:
            raise ValueError(f"dims {bad} out of range for {getattr(point, 'name', 'the site')} of size {size}")
        keep = torch.zeros(size, dtype=torch.bool, device=x.device)
        keep[dims] = True
        mask = mask & keep
    if positions is not None:
        axis = 2 if getattr(point, "layout", "tokens") == "pattern" else 1
        if x.ndim <= axis:
            raise ValueError(f"positions= needs a [B, T, ...] activation; {getattr(point, 'name', 'the site')} has "
                             f"shape {tuple(x.shape)}")
        t = x.shape[axis]
        keep = torch.zeros(t, dtype=torch.bool, device=x.device)
        keep[[p for p in positions if -t <= p < t]] = True
        mask = mask & keep.reshape(t, *([1] * (x.ndim - axis - 1)))
    return mask


def _label(name: str, *args, **kwargs) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items() if v is not None]
    return f"{name}({', '.join(parts)})"


def _elementwise(label: str, f: Callable[[Tensor], Tensor], dims, positions) -> Intervention:
    dims, positions = _ints("dims", dims), _ints("positions", positions)

    def fn(x: Tensor, point) -> Tensor:
        where = _where(x, point, dims, positions)
        y = f(x)
        return y if where is None else torch.where(where, y, x)

    return Intervention(label, fn)


def zero(dims: Sequence[int] | None = None, positions: Sequence[int] | None = None) -> Intervention:
    """Set ``dims`` (at ``positions``) to 0.  At a norm's site this is Kovaleva et al.'s (2021) ablation: a norm whose
    gain and bias are zeroed in a dimension outputs 0 there."""
    return _elementwise(_label("zero", dims=dims, positions=positions), torch.zeros_like, dims, positions)


def mean(values, dims: Sequence[int] | None = None, positions: Sequence[int] | None = None) -> Intervention:
    """Set ``dims`` (at ``positions``) to their mean: Sun et al.'s (2024) mean ablation.

    values : the means, ``[d]`` or a number; or ``{site: [d]}`` for a hook used at several sites; or an
        ``outlierlab.models.activation_cache.ActivationCache`` holding the site, whose mean over every token
        (``outlierlab.models.activation_cache.ActivationCache.mean``) is taken at first use.
    """
    dims_, positions_ = _ints("dims", dims), _ints("positions", positions)
    found: dict[str, Tensor] = {}

    def of(point) -> Tensor:
        name = getattr(point, "name", None)
        if name not in found:
            if isinstance(values, Mapping):  # {site: means} or a cache
                if name not in values:
                    raise KeyError(f"mean(...) has no mean for {name!r}; it has {', '.join(values) or 'none'}")
                v = values.mean(name) if callable(getattr(values, "mean", None)) else values[name]
            else:
                v = values
            found[name] = torch.as_tensor(v, dtype=torch.float32)
        return found[name]

    def fn(x: Tensor, point) -> Tensor:
        m = of(point).to(x.device, x.dtype)
        if m.ndim and m.shape != x.shape[-1:]:
            raise ValueError(f"mean(...): {m.numel()} means for {getattr(point, 'name', 'a site')} of size "
                             f"{x.shape[-1]}")
        where = _where(x, point, dims_, positions_)
        y = m.expand_as(x)
        return y.clone() if where is None else torch.where(where, y, x)

    shown = "cache" if hasattr(values, "mean") and isinstance(values, Mapping) else "values"
    return Intervention(_label("mean", shown, dims=dims, positions=positions).replace("'", ""), fn)


def clip(limit: float | None = None, *, low: float | None = None, high: float | None = None,
         dims: Sequence[int] | None = None, positions: Sequence[int] | None = None) -> Intervention:
    """Clamp to ``[-limit, limit]`` (or ``[low, high]``)."""
    if limit is not None:
        if low is not None or high is not None:
            raise ValueError("clip: give limit (a symmetric range) or low/high, not both")
        low, high = -float(limit), float(limit)
    if low is None and high is None:
        raise ValueError("clip: give limit=, or low= and/or high=")
    return _elementwise(_label("clip", low=low, high=high, dims=dims, positions=positions),
                        lambda x: x.clamp(low, high), dims, positions)


def scale(factor: float, dims: Sequence[int] | None = None, positions: Sequence[int] | None = None) -> Intervention:
    """Multiply by ``factor``."""
    return _elementwise(_label("scale", factor, dims=dims, positions=positions), lambda x: x * factor, dims,
                        positions)


def quantize(bits: int = 8, keep: Sequence[int] | None = None) -> Intervention:
    """Round the whole activation to a symmetric ``bits``-bit grid with one absmax scale (dynamic, per tensor):
    ``outlierlab.metrics.fake_quant.fake_quantize``.  ``keep``: hidden dims left in full precision and out of
    the scale (LLM.int8()'s decomposition)."""
    keep_ = _ints("keep", keep)

    def fn(x: Tensor, point) -> Tensor:
        k = None if keep_ is None else torch.tensor(keep_, dtype=torch.long, device=x.device)
        return fake_quantize(x, bits, k)

    return Intervention(_label("quantize", bits, keep=keep), fn)


def patch(source, dims: Sequence[int] | None = None, positions: Sequence[int] | None = None) -> Intervention:
    """Replace the activation by ``source``'s at the same site, texts and tokens: activation patching.

    source : an ``outlierlab.models.activation_cache.ActivationCache`` (or a run with one, ``.cache``) of the
        source texts at this site, text ``i`` of the source patched into text ``i`` of the run, token by token --
        so each pair must have as many tokens (one line names the first that does not).  Padding keeps its own value.
    """
    source = getattr(source, "cache", source)
    if source is None or not callable(getattr(source, "padded", None)):
        raise TypeError("patch(source): pass the ActivationCache of the source run (ol.run_with_cache, or "
                        "ol.run_with_hooks(..., cache=[sites]))")
    dims_, positions_ = _ints("dims", dims), _ints("positions", positions)

    def fn(x: Tensor, point) -> Tensor:
        name, texts, mask = point.name, point.texts, point.attention_mask
        if texts is None or mask is None:
            raise ValueError(f"patch at {name}: the hook needs the batch's texts (run it with ol.run_with_hooks)")
        if name not in source:
            raise KeyError(f"patch: the source cache has no {name!r}; it holds {', '.join(source) or 'no site'}")
        here, there = mask.sum(1).cpu(), source.lengths[texts.cpu()]
        if not torch.equal(here, there):
            b = int((here != there).nonzero()[0])
            raise ValueError(f"patch at {name}: text {int(texts[b])} has {int(here[b])} tokens here and "
                             f"{int(there[b])} in the source; patch between texts of as many tokens")
        t = mask.shape[1]
        src = source.padded(name, texts.cpu(), t).to(x.device, x.dtype)
        if src.shape != x.shape:
            raise ValueError(f"patch at {name}: the source's activation has shape {tuple(src.shape)}, this run's "
                             f"{tuple(x.shape)}")
        real = mask.to(x.device).bool()
        if point.layout == "pattern":
            real = (real[:, None, :, None] & real[:, None, None, :])
        else:
            real = real.reshape(*real.shape, *([1] * (x.ndim - 2)))
        where = _where(x, point, dims_, positions_)
        where = real if where is None else real & where
        return torch.where(where, src, x)

    return Intervention(_label("patch", "source", dims=dims, positions=positions).replace("'", ""), fn)
