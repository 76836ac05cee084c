"""The transforms ``evaluate.py`` compares side by side, fitted from the ``transform`` config node.

The transforms themselves are defined once, in :mod:`outlierlab.analysis.transforms` (clip, :class:`FittedTransform`),
:mod:`outlierlab.analysis.whitening` (:class:`Whitener`: the streamed float64 sums and the guard) and
:mod:`outlierlab.analysis.postprocessing` (whiten, standardize, abtt, center from those sums); this module only
reads the settings (``transform.dims`` / ``dims_by_layer`` / ``k`` / ``abtt_d`` / ``min_fit_ratio`` /
``allow_degenerate``) and keeps, per analysis, which transforms are ready and how each was obtained — so every
analysis (outliers, anisotropy, isotropy, self-similarity, WiC, STS) fits and guards its maps the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from outlierlab.analysis.transforms import (FITTED, MIN_FIT_RATIO, TRANSFORMS, FittedTransform, Whitener,
                                            WhiteningFit, clip_description, clip_dims_per_layer)
from outlierlab.evaluation.settings import TransformSettings


@dataclass
class WhitenSettings:
    """How the fitted transforms (whiten, standardize, abtt, center) are fitted and guarded:
    ``transform.k`` (whiten's kept dims), ``transform.abtt_d`` (all-but-the-top's D), ``transform.min_fit_ratio``
    and ``transform.allow_degenerate`` (:meth:`outlierlab.analysis.whitening.Whitener.check`)."""

    k: int | None = None
    min_ratio: float = MIN_FIT_RATIO
    allow_degenerate: bool = False
    abtt_d: int | None = None

    @classmethod
    def from_settings(cls, t: TransformSettings) -> "WhitenSettings":
        """From the ``transform`` section.  A key is absent when no group that sets it is selected (then
        nothing uses it): the guard then keeps the analysis library's own defaults."""
        guard = {name: value for name, value in (("min_ratio", t.min_fit_ratio),
                                                 ("allow_degenerate", t.allow_degenerate)) if value is not None}
        return cls(t.k, **guard, abtt_d=t.abtt_d)

    def new(self, num_layers: int, dim: int) -> Whitener:
        """An empty accumulator to ``partial_fit`` (its sums fit every method: :meth:`fit_all`)."""
        return Whitener(num_layers, dim, k=self.k)

    def fit_by_layer(self, num_layers: int, dim: int, chunks, names=FITTED, keep_cov: bool = False,
                     on_disk: str | bool | None = None) -> Whitener:
        """Fitted from per-layer streams of vectors, one layer at a time
        (:meth:`outlierlab.analysis.whitening.Whitener.fit_by_layer`), for the maps ``names`` (:meth:`fit_all`);
        Σ is kept when asked (IsoScore) or when a map other than whiten is derived from it; ``on_disk``: Σ and
        the maps in files, read one layer at a time."""
        keep = keep_cov or any(n in FITTED and n != "whiten" for n in names)
        return Whitener.fit_by_layer(num_layers, dim, chunks, k=self.k, keep_cov=keep, on_disk=on_disk)

    def finish(self, whitener: Whitener, what: str) -> WhiteningFit:
        """Finalize and guard (:meth:`outlierlab.analysis.whitening.Whitener.check`): raises one line on a degenerate fit
        unless ``transform.allow_degenerate=true``."""
        if whitener.W is None:
            whitener.finalize()
        return whitener.check(what, self.min_ratio, self.allow_degenerate)

    def fit_all(self, acc: Whitener, names, what: str) -> dict[str, tuple[Whitener, WhiteningFit]]:
        """Every fitted transform among ``names`` from the sums of ``acc`` (one pass fits them all), each
        guarded: ``{name: (fitted Whitener, its WhiteningFit)}``."""
        out = {}
        wanted = [n for n in FITTED if n in names]
        if acc.W is None and wanted:
            # Σ over the sums in place, eigenvectors kept only for a second map that needs them: the fit's
            # float64 working set is Σ and W, each (L+1)·d² (issue 39: 4 such arrays were alive together)
            acc.finalize(release_sums=True, keep_eigvecs="abtt" in wanted and "whiten" in wanted)
        for name in wanted:
            w = acc if name == "whiten" else acc.derive(name, abtt_d=self.abtt_d if name == "abtt" else None)
            out[name] = (w, self.finish(w, what))
        if acc.W is not None:  # fitted: Σxxᵀ and Σ's eigenvectors ((L+1)·d² float64 each) are needed no more
            for w in [acc] + [w for w, _ in out.values()]:
                w.sum_outer, w._eig = None, None  # kept: mean, W, Σ (IsoScore), the eigenvalues
        return out


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
    dims) and the fitted maps of :data:`outlierlab.analysis.postprocessing.FITTED` (``whiten``, Su et al. 2021;
    ``standardize``; ``abtt``, Mu & Viswanath 2018; ``center``), with a line saying how each was obtained
    (``info``) and what each fitted map was fitted on (``fits``, CSV columns).  ``source`` is the accumulator
    whose float64 sums they were fitted from (its ``cov`` is Σ of the fit data, for IsoScore)."""

    clip_dims: list[list[int]] | None = None
    fitted: dict[str, Whitener] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    fits: dict[str, WhiteningFit] = field(default_factory=dict)
    source: Whitener | None = None

    @property
    def whitener(self) -> Whitener | None:
        """The fitted ``whiten`` map (None when not fitted)."""
        return self.fitted.get("whiten")

    def ready(self, name: str) -> bool:
        return name == "none" or (name == "clip" and self.clip_dims is not None) or \
            (name in self.fitted and self.fitted[name].W is not None)

    def get(self, name: str, dim: int | None = None) -> FittedTransform:
        """The fitted transform ``name`` (:class:`outlierlab.analysis.transforms.FittedTransform`)."""
        if name not in TRANSFORMS:
            raise ValueError(f"unknown transform {name!r}; valid: {', '.join(TRANSFORMS)}")
        any_fit = next(iter(self.fitted.values()), None)
        d = dim if dim is not None else (any_fit.dim if any_fit is not None else 0)
        return FittedTransform(name, d, self.clip_dims if name == "clip" else None,
                               self.fitted.get(name) if name in FITTED else None, self.info.get(name, ""),
                               self.fits.get(name))

    def apply(self, name: str, x: Tensor) -> Tensor:
        """Transform vectors ``[L, ..., d]`` (every layer with its own dims / fitted map)."""
        return self.get(name, x.shape[-1])(x)

    def out_dim(self, name: str, dim: int) -> int:
        return self.fitted[name].out_dim if name in FITTED and name in self.fitted else dim

    def set_whitener(self, whitener: Whitener, fit: WhiteningFit) -> None:
        """Keep one fitted map (its ``method`` names the transform) and what it was fitted on."""
        name = whitener.method
        self.fitted[name], self.fits[name], self.info[name] = whitener, fit, fit.describe()

    def set_all(self, fitted: dict[str, tuple[Whitener, WhiteningFit]], source: Whitener | None = None) -> None:
        """Keep every map of :meth:`WhitenSettings.fit_all`."""
        for w, fit in fitted.values():
            self.set_whitener(w, fit)
        if source is not None:
            self.source = source

    def columns(self, name: str) -> dict:
        """CSV columns of a row of transform ``name``: what a fitted result was fitted on."""
        fit = self.fits.get(name)
        if fit is None and name in self.fitted:
            fit = self.fitted[name].fit_info
        return fit.columns() if fit is not None else {}
