"""Fitting the transforms: the one place where ``probe.py`` and ``evaluate.py`` fit them.

The transforms themselves are defined in ``outlierlab.metrics.transforms`` (clip, ``FittedTransform``),
``outlierlab.metrics.whitening`` (``Whitener``: the streamed float64 sums and the guard) and
``outlierlab.metrics.postprocessing`` (whiten, standardize, abtt, center from those sums).  Fitting them is

* clip: the dims given (``transform.dims`` / ``dims_by_layer``) or detected on the fit data (``clip_dims``);
* the fitted maps: one set of float64 sums (``WhitenSettings``), streamed either from ``[L, n, d]`` chunks
  of every layer (``WhitenSettings.fit_chunks``; ``evaluate.py``'s two-pass stream adds them itself with
  ``WhitenSettings.new``) or layer by layer (``WhitenSettings.fit_by_layer``: a token store, maps on
  disk), from which ``WhitenSettings.fit_all`` fits every map asked for (whiten with ``k``, abtt with
  ``abtt_d``), each under the degenerate-fit guard (``min_ratio``, ``allow_degenerate``, a ``what`` for the
  message and the CSV columns).

``probe.py`` fits one transform at a time on the training features (``fit_transform``) and keeps float64
maps; ``evaluate.py`` fits every map at once into a ``FittedTransforms`` and keeps float32 ones in the
sums' memory (``compact``).  Pure tensor code: the settings come in as plain values or as
``evaluate.py``'s ``transform`` section, read by attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from torch import Tensor

from outlierlab.metrics.postprocessing import FITTED
from outlierlab.metrics.transforms import (MIN_FIT_RATIO, TRANSFORMS, FittedTransform, Whitener, WhiteningFit,
                                            clip_description, clip_dims_per_layer)

__all__ = ["WhitenSettings", "FittedTransforms", "clip_dims", "given_clip_dims", "fit_transform"]


@dataclass
class WhitenSettings:
    """How the fitted transforms (whiten, standardize, abtt, center) are fitted and guarded:
    ``transform.k`` (whiten's kept dims), ``transform.abtt_d`` (all-but-the-top's D), ``transform.min_fit_ratio``
    and ``transform.allow_degenerate`` (``outlierlab.metrics.whitening.Whitener.check``)."""

    k: int | None = None
    min_ratio: float = MIN_FIT_RATIO
    allow_degenerate: bool = False
    abtt_d: int | None = None

    @classmethod
    def from_settings(cls, t) -> "WhitenSettings":
        """From ``evaluate.py``'s ``transform`` section (``outlierlab.configuration.run_settings.TransformSettings``).
        A key is absent when no group that sets it is selected (then nothing uses it): the guard then keeps
        the analysis library's own defaults."""
        guard = {name: value for name, value in (("min_ratio", t.min_fit_ratio),
                                                 ("allow_degenerate", t.allow_degenerate)) if value is not None}
        return cls(t.k, **guard, abtt_d=t.abtt_d)

    def new(self, num_layers: int, dim: int) -> Whitener:
        """An empty accumulator to ``partial_fit`` (its sums fit every method: ``fit_all``)."""
        return Whitener(num_layers, dim, k=self.k)

    def fit_chunks(self, num_layers: int, dim: int, chunks: Iterable[Tensor]) -> Whitener:
        """The sums of ``[L, n, d]`` chunks of every layer (for ``fit_all``)."""
        acc = self.new(num_layers, dim)
        for x in chunks:
            acc.partial_fit(x)
        return acc

    def fit_by_layer(self, num_layers: int, dim: int, chunks: Callable[[int], Iterable[Tensor]], names=FITTED,
                     keep_cov: bool = False, on_disk: str | bool | None = None) -> Whitener:
        """Fitted from per-layer streams of vectors, one layer at a time
        (``outlierlab.metrics.whitening.Whitener.fit_by_layer``), for the maps ``names`` (``fit_all``);
        Σ is kept when asked (IsoScore) or when a map other than whiten is derived from it; ``on_disk``: Σ and
        the maps in files, read one layer at a time."""
        keep = keep_cov or any(n in FITTED and n != "whiten" for n in names)
        return Whitener.fit_by_layer(num_layers, dim, chunks, k=self.k, keep_cov=keep, on_disk=on_disk)

    def finish(self, whitener: Whitener, what: str) -> WhiteningFit:
        """Finalize and guard (``outlierlab.metrics.whitening.Whitener.check``): raises one line on a degenerate fit
        unless ``transform.allow_degenerate=true``."""
        if whitener.W is None:
            whitener.finalize()
        return whitener.check(what, self.min_ratio, self.allow_degenerate)

    def fit_all(self, acc: Whitener, names, what: str,
                compact: bool = True) -> dict[str, tuple[Whitener, WhiteningFit]]:
        """Every fitted transform among ``names`` from the sums of ``acc`` (one pass fits them all), each
        guarded: ``{name: (fitted Whitener, its WhiteningFit)}``.

        ``compact``: Σ and W in float32, in the memory of the float64 sums (``evaluate.py``: the sums of a 70B
        model are 43 GB); the maps derived from Σ then read that float32 Σ.  False: Σ and every map
        in float64 (``probe.py``, whose maps have always been fitted so: its results stay the same).  A fit
        of ``fit_by_layer`` is compact already."""
        out = {}
        wanted = [n for n in FITTED if n in names]
        if acc.W is None and wanted and compact:
            # Σ over the sums in place, eigenvectors kept only for a second map that needs them: the fit's
            # float64 working set is Σ and W, each (L+1)·d² (4 such arrays were once alive together)
            acc.finalize(release_sums=True, keep_eigvecs="abtt" in wanted and "whiten" in wanted)
        elif acc.W is None and wanted:
            acc.finalize()
        for name in wanted:
            w = acc if name == "whiten" else acc.derive(name, abtt_d=self.abtt_d if name == "abtt" else None)
            out[name] = (w, self.finish(w, what))
        if acc.W is not None:  # fitted: Σxxᵀ and Σ's eigenvectors ((L+1)·d² float64 each) are needed no more
            for w in [acc] + [w for w, _ in out.values()]:
                w.release_fit_state()
        return out


def clip_dims(num_layers: int, dim: int, dims: Sequence[int] | None = None,
              dims_by_layer: Mapping[str, Sequence[int]] | None = None,
              detected: Sequence[Sequence[int]] | None = None,
              detected_on: str = "train") -> tuple[list[list[int]], str]:
    """Clip's dims per layer and the report line saying where they came from: given (``dims``: every layer,
    ``dims_by_layer``: per layer range, Luo et al. 2021 App. D.1) or ``detected`` on ``detected_on``
    (``outlierlab.metrics.transforms.clip_dims_per_layer``, which raises when neither is there)."""
    per_layer, source = clip_dims_per_layer(num_layers, dim, dims, dims_by_layer, detected)
    return per_layer, clip_description(per_layer, f"detected on {detected_on}" if source == "detected" else source)


def given_clip_dims(t, num_layers: int, dim: int) -> tuple[list[list[int]] | None, str]:
    """Given clip dims (``transform.dims`` or ``transform.dims_by_layer`` of ``evaluate.py``'s ``transform``
    section) per layer, or ``(None, "")`` when they are to be detected."""
    if t.dims is None and not t.dims_by_layer:
        return None, ""
    return clip_dims(num_layers, dim, t.dims, t.dims_by_layer)


@dataclass
class FittedTransforms:
    """The per-layer transforms of one analysis: ``none``, ``clip`` (Luo et al. 2021 §4: zero the outlier
    dims) and the fitted maps of ``outlierlab.metrics.postprocessing.FITTED`` (``whiten``, Su et al. 2021;
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
        """The fitted transform ``name`` (``outlierlab.metrics.transforms.FittedTransform``)."""
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
        """Keep every map of ``WhitenSettings.fit_all``."""
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


def fit_transform(name: str, num_layers: int, dim: int, train_chunks: Callable[[], Iterable] | None,
                  outlier_dims: list[list[int]] | None = None, dims: Sequence[int] | None = None,
                  k: int | None = None, dims_by_layer: Mapping[str, Sequence[int]] | None = None,
                  fit_what: str = "the training vectors", min_ratio: float = MIN_FIT_RATIO,
                  allow_degenerate: bool = False, abtt_d: int | None = None) -> FittedTransform:
    """Fit one transform on the TRAINING features only (``probe.py``), in float64 (``WhitenSettings.fit_all``).

    Parameters
    ----------
    name : {"none", "clip", "whiten", "standardize", "abtt", "center"}
    train_chunks : callable returning an iterator of ``(rows, float32 [L, n, d])`` training chunks
        (``outlierlab.datamodules.features.iter_chunks``; the fitted maps stream float64 sums over them).
    outlier_dims : per-layer dims detected on the training features (clip with no dims given).
    dims, dims_by_layer : dims to clip in every layer / per layer range (``clip_dims``), overriding detection.
    k : whitening dimension (Su et al. 2021), None = all.
    abtt_d : all-but-the-top's D (Mu & Viswanath 2018), None = d/100 (``outlierlab.metrics.postprocessing``).
    fit_what, min_ratio, allow_degenerate : the guard (``Whitener.check``):
        a fit on too few distinct vectors raises one line unless ``allow_degenerate``.
    """
    ft = FittedTransforms()
    if name == "clip":
        ft.clip_dims, ft.info["clip"] = clip_dims(num_layers, dim, dims, dims_by_layer, outlier_dims)
    elif name in FITTED:
        fit = WhitenSettings(k if name == "whiten" else None, min_ratio, allow_degenerate, abtt_d)
        acc = fit.fit_chunks(num_layers, dim, (x for _, x in train_chunks()))
        ft.set_all(fit.fit_all(acc, [name], fit_what, compact=False))
    return ft.get(name, dim)
