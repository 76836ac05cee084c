"""Post-hoc vector transforms: clipping outlier dims (Luo et al. 2021 §4) and whitening (Su et al. 2021).

Both operate on batched layers ``[L, N, d]`` so that one call transforms every layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["clip", "clip_mask", "Whitener"]


def _as_per_layer(dims, num_layers: int) -> list[list[int]]:
    """``dims`` as one list per layer: accepts a list of ints (shared), or a list of lists (per layer)."""
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    dims = list(dims)
    # a per-layer entry is any sized container (list, tuple, range, 1-D tensor/array); ints and 0-d
    # tensors are single dims
    nested = [hasattr(d, "__len__") and getattr(d, "ndim", 1) > 0 for d in dims]
    if dims and all(nested):
        if len(dims) != num_layers:
            raise ValueError(f"per-layer dims has {len(dims)} lists but the input has {num_layers} layers.")
        return [[int(x) for x in d] for d in dims]
    if any(nested):
        raise ValueError("dims must be a list of ints (same dims for every layer) or a list of lists (one per layer).")
    return [[int(x) for x in dims] for _ in range(num_layers)]


def clip_mask(dims, num_layers: int, dim: int, device: torch.device | str | None = None) -> Tensor:
    """Bool Tensor[L, d], True at the dims to clip (``dims`` as in :func:`clip`)."""
    per_layer = _as_per_layer(dims, num_layers)
    mask = torch.zeros(num_layers, dim, dtype=torch.bool, device=device)
    for layer, ds in enumerate(per_layer):
        bad = [x for x in ds if not -dim <= x < dim]
        if bad:
            raise ValueError(f"clip dims {bad} out of range for hidden size {dim}.")
        mask[layer, ds] = True
    return mask


def clip(x: Tensor, dims: Sequence[int] | Sequence[Sequence[int]]) -> Tensor:
    """Zero the given dimensions (Luo et al. 2021 §4: "clipping" the outlier dims).

    Parameters
    ----------
    x : Tensor[L, ..., d] or Tensor[N, d]
        With a per-layer ``dims`` the first axis is the layer axis; with shared dims any shape works.
    dims : list[int] or list[list[int]]
        One list applied to every layer, or one list per layer (e.g. the output of
        :func:`analysis.outliers.detect_outlier_dims`).

    Returns
    -------
    Tensor
        A new tensor (the input is not modified) equal to ``x`` with the dims set to 0.
    """
    if x.ndim < 2:
        raise ValueError(f"clip expects at least [N, d], got shape {tuple(x.shape)}.")
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    per_layer = _as_per_layer(dims, x.shape[0] if x.ndim >= 3 else 1) if len(dims) else [[]]
    shared = all(p == per_layer[0] for p in per_layer)
    mask = clip_mask([per_layer[0]] if shared else per_layer, 1 if shared else len(per_layer), x.shape[-1], x.device)
    mask = mask.view(mask.shape[0], *([1] * (x.ndim - 2)), x.shape[-1])
    if shared:
        mask = mask.view(*([1] * (x.ndim - 1)), x.shape[-1])
    return torch.where(mask, torch.zeros((), dtype=x.dtype, device=x.device), x)


class Whitener:
    r"""Streaming whitening transform fitted per layer (Su et al. 2021, "Whitening Sentence
    Representations for Better Semantics and Faster Retrieval"; Luo's thesis §3.2.3).

    .. math:: \mu = \tfrac1N\sum_t x_t,\quad
              \Sigma = \tfrac1{N-1}\sum_t (x_t-\mu)(x_t-\mu)^\top,\quad
              U, S, U^\top = \operatorname{svd}(\Sigma),\quad
              W = U\,\operatorname{diag}(1/\sqrt{\max(S, \varepsilon S_1)}),\quad
              \hat x = (x-\mu)\,W_{[:, :k]}

    Σ uses N−1 like ``np.cov`` in Su et al.'s reference code, so the fitted vectors' sample covariance
    (ddof=1) is exactly I.  :meth:`partial_fit` only accumulates float64 sums Σx and Σxxᵀ (memory
    O(L·d²), never the vectors); :meth:`finalize` turns them into μ and W.

    Parameters
    ----------
    num_layers, dim : int
    k : int or None
        Keep the first k columns of W (dimension reduction, Su et al.); None keeps all d.
    eps : float
        Relative floor for singular values: each S_i is raised to at least ``eps · S_1`` before the
        inverse square root, so directions with (near-)zero variance — e.g. dims zeroed by
        :func:`clip` before whitening, or N ≤ d — are scaled by at most 1/√(eps·S_1) instead of
        blowing up to inf/NaN.  Such directions are then *not* whitened to unit variance (their
        variance stays ≤ 1); with full-rank data and the default 1e-10 nothing changes.

    Attributes (after :meth:`finalize`)
    ----------------------------------
    mean : Tensor[L, d] float64
    W : Tensor[L, d, k] float64
    singular_values : Tensor[L, d] float64 (before the floor)

    Notes
    -----
    Fit on training vectors only (the caller's job); :meth:`transform` never changes the fit.
    """

    def __init__(self, num_layers: int, dim: int, k: int | None = None, eps: float = 1e-10,
                 device: torch.device | str | None = None):
        if k is not None and not 1 <= k <= dim:
            raise ValueError(f"whitening k must be in [1, {dim}] or None, got {k}.")
        self.num_layers, self.dim, self.k, self.eps = int(num_layers), int(dim), k, float(eps)
        dev = torch.device("cpu") if device is None else torch.device(device)
        self.sum = torch.zeros(num_layers, dim, dtype=torch.float64, device=dev)
        self.sum_outer = torch.zeros(num_layers, dim, dim, dtype=torch.float64, device=dev)
        self.n = 0
        self.mean: Tensor | None = None
        self.W: Tensor | None = None
        self.singular_values: Tensor | None = None

    def _as_lnd(self, x: Tensor) -> Tensor:
        if x.ndim == 2 and self.num_layers == 1:
            x = x.unsqueeze(0)
        if x.ndim != 3 or x.shape[0] != self.num_layers or x.shape[-1] != self.dim:
            raise ValueError(f"expected vectors [L={self.num_layers}, N, d={self.dim}] "
                             f"(or [N, d] when L=1), got {tuple(x.shape)}.")
        return x

    def partial_fit(self, x: Tensor) -> "Whitener":
        """Accumulate a chunk of training vectors ``[L, N, d]``; returns self."""
        x = self._as_lnd(x).detach().to(torch.float64)  # reduce on x's device, move only [L, d(, d)]
        self.sum += x.sum(1).to(self.sum.device)
        self.sum_outer += (x.transpose(1, 2) @ x).to(self.sum.device)
        self.n += x.shape[1]
        self.mean = self.W = self.singular_values = None  # stale until finalize()
        return self

    def fit(self, x: Tensor) -> "Whitener":
        """One-shot :meth:`partial_fit` + :meth:`finalize`."""
        return self.partial_fit(x).finalize()

    def finalize(self) -> "Whitener":
        """Compute μ, Σ and W from the accumulated sums; returns self."""
        if self.n < 2:
            raise ValueError(f"whitening needs at least 2 training vectors, got {self.n}.")
        mean = self.sum / self.n
        cov = (self.sum_outer - self.n * mean.unsqueeze(2) * mean.unsqueeze(1)) / (self.n - 1)
        cov = 0.5 * (cov + cov.transpose(1, 2))  # symmetric up to rounding
        # Σ is symmetric PSD, so its SVD is its eigendecomposition; eigh is ~7x faster than svd for
        # 13 layers x 768 dims. eigh sorts ascending: flip to the descending order of the SVD.
        s, u = torch.linalg.eigh(cov)
        s, u = s.flip(-1).clamp_min(0.0), u.flip(-1)
        floor = (self.eps * s[:, :1]).clamp_min(torch.finfo(torch.float64).tiny)
        w = u / s.clamp_min(floor).sqrt().unsqueeze(1)
        self.mean, self.singular_values = mean, s
        self.W = w if self.k is None else w[:, :, : self.k].contiguous()
        return self

    def transform(self, x: Tensor) -> Tensor:
        """:math:`\\hat x = (x-\\mu)W` for ``x`` of shape [L, ..., d] (or [N, d] when L=1), in ``x``'s dtype.

        float64 inputs are transformed in float64, everything else in float32.
        """
        if self.W is None:
            raise ValueError("Whitener is not fitted: call partial_fit(...) then finalize() first.")
        squeeze = x.ndim == 2 and self.num_layers == 1
        xx = x.unsqueeze(0) if squeeze else x
        if xx.ndim < 3 or xx.shape[0] != self.num_layers or xx.shape[-1] != self.dim:
            raise ValueError(f"expected vectors [L={self.num_layers}, ..., d={self.dim}], got {tuple(x.shape)}.")
        cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        shape = xx.shape
        flat = xx.reshape(shape[0], -1, shape[-1]).to(cdt)
        mu = self.mean.to(device=x.device, dtype=cdt).unsqueeze(1)
        out = (flat - mu) @ self.W.to(device=x.device, dtype=cdt)
        out = out.reshape(*shape[:-1], out.shape[-1]).to(x.dtype)
        return out.squeeze(0) if squeeze else out

    # -- caching --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to rebuild the fitted transform (tensors + plain values; torch.save-able)."""
        if self.W is None:
            raise ValueError("Whitener is not fitted: nothing to save.")
        return {"num_layers": self.num_layers, "dim": self.dim, "k": self.k, "eps": self.eps, "n": self.n,
                "mean": self.mean.cpu(), "W": self.W.cpu(), "singular_values": self.singular_values.cpu()}

    def load_state_dict(self, state: dict) -> "Whitener":
        """Load a fitted transform from :meth:`state_dict` into this instance (shapes must match); returns self."""
        other = Whitener.from_state_dict(state)
        if (other.num_layers, other.dim) != (self.num_layers, self.dim):
            raise ValueError(f"whitening state is for L={other.num_layers}, d={other.dim}; "
                             f"this Whitener is L={self.num_layers}, d={self.dim}.")
        self.k, self.eps, self.n = other.k, other.eps, other.n
        self.mean, self.W, self.singular_values = other.mean, other.W, other.singular_values
        return self

    @classmethod
    def from_state_dict(cls, state: dict) -> "Whitener":
        """Rebuild a fitted Whitener from :meth:`state_dict` (running sums are not restored)."""
        missing = {"num_layers", "dim", "k", "eps", "n", "mean", "W"} - set(state)
        if missing:
            raise ValueError(f"whitening state is missing keys {sorted(missing)}.")
        w = cls(state["num_layers"], state["dim"], state["k"], state["eps"])
        w.n, w.mean, w.W = state["n"], state["mean"].to(torch.float64), state["W"].to(torch.float64)
        w.singular_values = state.get("singular_values")
        return w
