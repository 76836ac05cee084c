"""The transforms ``evaluate.py`` compares side by side, fitted from the ``transform`` config node.

The transforms themselves are defined once, in :mod:`outlierlab.analysis.transforms` (clip, :class:`FittedTransform`)
and :mod:`outlierlab.analysis.whitening` (:class:`Whitener` and its guard); this module only reads the settings
(``transform.dims`` / ``dims_by_layer`` / ``k`` / ``min_fit_ratio`` / ``allow_degenerate``) and keeps, per
analysis, which transforms are ready and how each was obtained — so every analysis (outliers, anisotropy,
self-similarity, WiC, STS) fits and guards its whitener the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from outlierlab.analysis.transforms import (MIN_FIT_RATIO, TRANSFORMS, FittedTransform, Whitener, WhiteningFit,
                                 clip_description, clip_dims_per_layer)
from outlierlab.evaluation.settings import TransformSettings


@dataclass
class WhitenSettings:
    """``transform.k`` (kept dims), ``transform.min_fit_ratio`` and ``transform.allow_degenerate``."""

    k: int | None = None
    min_ratio: float = MIN_FIT_RATIO
    allow_degenerate: bool = False

    @classmethod
    def from_settings(cls, t: TransformSettings) -> "WhitenSettings":
        """From the ``transform`` section.  Its whiten keys are absent when the whiten group is not selected
        (then nothing is whitened): the guard then keeps the analysis library's own defaults."""
        guard = {name: value for name, value in (("min_ratio", t.min_fit_ratio),
                                                 ("allow_degenerate", t.allow_degenerate)) if value is not None}
        return cls(t.k, **guard)

    def new(self, num_layers: int, dim: int) -> Whitener:
        """An empty whitener to ``partial_fit``."""
        return Whitener(num_layers, dim, k=self.k)

    def finish(self, whitener: Whitener, what: str) -> WhiteningFit:
        """Finalize and guard (:meth:`outlierlab.analysis.whitening.Whitener.check`): raises one line on a degenerate fit
        unless ``transform.allow_degenerate=true``."""
        if whitener.W is None:
            whitener.finalize()
        return whitener.check(what, self.min_ratio, self.allow_degenerate)


def given_clip_dims(t: TransformSettings, num_layers: int, dim: int) -> tuple[list[list[int]] | None, str]:
    """Given clip dims (``transform.dims`` or ``transform.dims_by_layer``) per layer, or ``(None, "")`` when
    they are to be detected."""
    dims, by_layer = t.dims, t.dims_by_layer
    if dims is None and not by_layer:
        return None, ""
    per, source = clip_dims_per_layer(num_layers, dim, None if dims is None else list(dims),
                                      dict(by_layer) if by_layer else None)
    return per, clip_description(per, source)


@dataclass
class FittedTransforms:
    """The per-layer transforms of one analysis: ``none``, ``clip`` (Luo et al. 2021 §4: zero the outlier
    dims) and ``whiten`` (Su et al. 2021), with a line saying how each was obtained (``info``) and, for
    whiten, what it was fitted on (``fits``, CSV columns)."""

    clip_dims: list[list[int]] | None = None
    whitener: Whitener | None = None
    info: dict[str, str] = field(default_factory=dict)
    fits: dict[str, WhiteningFit] = field(default_factory=dict)

    def ready(self, name: str) -> bool:
        return name == "none" or (name == "clip" and self.clip_dims is not None) or \
            (name == "whiten" and self.whitener is not None and self.whitener.W is not None)

    def get(self, name: str, dim: int | None = None) -> FittedTransform:
        """The fitted transform ``name`` (:class:`outlierlab.analysis.transforms.FittedTransform`)."""
        if name not in TRANSFORMS:
            raise ValueError(f"unknown transform {name!r}; valid: {', '.join(TRANSFORMS)}")
        d = dim if dim is not None else (self.whitener.dim if self.whitener is not None else 0)
        return FittedTransform(name, d, self.clip_dims if name == "clip" else None,
                               self.whitener if name == "whiten" else None, self.info.get(name, ""),
                               self.fits.get(name))

    def apply(self, name: str, x: Tensor) -> Tensor:
        """Transform vectors ``[L, ..., d]`` (every layer with its own dims / whitener)."""
        return self.get(name, x.shape[-1])(x)

    def out_dim(self, name: str, dim: int) -> int:
        return self.whitener.out_dim if name == "whiten" else dim

    def set_whitener(self, whitener: Whitener, fit: WhiteningFit) -> None:
        self.whitener, self.fits["whiten"], self.info["whiten"] = whitener, fit, fit.describe()

    def columns(self, name: str) -> dict:
        """CSV columns of a row of transform ``name``: what a whitened result was fitted on."""
        fit = self.fits.get(name)
        if fit is None and name == "whiten" and self.whitener is not None:
            fit = self.whitener.fit_info
        return fit.columns() if fit is not None else {}
