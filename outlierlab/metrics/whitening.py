"""Whitening (Su et al. 2021, "Whitening Sentence Representations for Better Semantics and Faster Retrieval"), fitted
per layer by streaming float64 sums under the sample-size guard of ``Whitener.check``
(``outlierlab.metrics.fit_guard``), and from the same sums the other affine maps of
``outlierlab.metrics.postprocessing`` (standardize, all-but-the-top, center; ``Whitener(method=...)``).

Pure tensor code: no config, no files.  Re-exported by ``outlierlab.metrics.transforms``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from outlierlab.metrics.gram import gram
from outlierlab.metrics.fit_guard import MIN_FIT_RATIO, DegenerateWhiteningError, WhiteningFit, check_fit
from outlierlab.metrics.postprocessing import FITTED, affine_matrix, default_abtt_d
from outlierlab.utils.disk_layers import DiskLayers
from outlierlab.utils.memory import release_freed_memory

__all__ = ["Whitener", "WhiteningFit", "DegenerateWhiteningError", "MIN_FIT_RATIO"]

class Whitener:
    r"""Streaming whitening transform fitted per layer (Su et al. 2021, "Whitening Sentence Representations for Better
    Semantics and Faster Retrieval"; Luo's thesis §3.2.3).

    .. math:: \mu = \tfrac1N\sum_t x_t,\quad
              \Sigma = \tfrac1{N-1}\sum_t (x_t-\mu)(x_t-\mu)^\top,\quad
              U, S, U^\top = \operatorname{svd}(\Sigma),\quad
              W = U\,\operatorname{diag}(1/\sqrt{\max(S, \varepsilon S_1)}),\quad
              \hat x = (x-\mu)\,W_{[:, :k]}

    Σ uses N−1 like ``np.cov`` in Su et al.'s code, so the fitted vectors' sample covariance is exactly I.
    ``partial_fit`` accumulates float64 sums Σ(x−x₀) and Σ(x−x₀)(x−x₀)ᵀ about the first vector x₀ (a large mean, the
    outlier dims, then does not cancel catastrophically, so the numerical rank is honest); memory O(L·d²).  It also
    counts distinct fitted vectors (64-bit row hashes, exact up to ``distinct_cap``, None: 16·d, enough for ``check``).

    ``k`` keeps the first k columns of W (Su et al.'s reduction; None: all d).  ``eps`` floors each S_i at ``eps ·
    S_1``, so (near-)zero-variance directions (dims zeroed by ``transforms.clip``, or N ≤ d) are scaled by at most
    1/√(eps·S_1) instead of inf/NaN; full-rank data is unaffected.  ``method`` ∈ {"whiten", "standardize", "abtt",
    "center"} picks the map ``finalize`` fits (``postprocessing.affine_matrix``; ``k`` is whiten's only; ``abtt_d``:
    all-but-the-top's D, None: d/100); ``derive`` fits another from the same sums.

    After ``finalize``: ``mean`` [L, d], ``W`` [L, d, k] (whiten) or [L, d, d], ``cov`` [L, d, d] (ddof 1; IsoScore
    reads it), ``singular_values`` [L, d] (before the floor), all float64; ``rank`` [L], the eigenvalues above ``S_1 · d
    · 1e4 · eps(float64)`` (a post-LayerNorm layer has rank ≤ d−1: harmless); ``n_distinct`` [L] (capped).  Fit on
    training vectors only; ``transform`` never changes the fit.
    """

    #: Running tensors with one row per layer, and lists with one entry per layer
    #: (:func:`outlierlab.metrics.layer_accumulators.stack_layers`).
    LAYER_STATE = ("sum", "sum_outer", "shift")
    LAYER_LISTS = ("_hashes", "_distinct_stopped")

    def __init__(self, num_layers: int, dim: int, k: int | None = None, eps: float = 1e-10,
                 device: torch.device | str | None = None, distinct_cap: int | None = None,
                 method: str = "whiten", abtt_d: int | None = None, *, allocate: bool = True):
        if method not in FITTED:
            raise ValueError(f"unknown fitted transform {method!r}; valid: {', '.join(FITTED)}")
        if k is not None and not 1 <= k <= dim:
            raise ValueError(f"whitening k must be in [1, {dim}] or None, got {k}.")
        if k is not None and method != "whiten":
            raise ValueError(f"k (kept dims) applies to whiten only, not to {method}")
        if method == "abtt" and abtt_d is not None and not 0 <= abtt_d < dim:
            raise ValueError(f"transform.abtt_d must be in [0, {dim - 1}] for hidden size {dim}, got {abtt_d}")
        self.method = method
        self.abtt_d = (default_abtt_d(dim) if abtt_d is None else int(abtt_d)) if method == "abtt" else None
        self.num_layers, self.dim, self.k, self.eps = int(num_layers), int(dim), k, float(eps)
        dev = torch.device("cpu") if device is None else torch.device(device)
        # allocate=False: no sums (fit_by_layer fills the fitted state itself)
        self.sum = torch.zeros(num_layers, dim, dtype=torch.float64, device=dev) if allocate else None
        self.sum_outer = torch.zeros(num_layers, dim, dim, dtype=torch.float64, device=dev) if allocate else None
        self.shift: Tensor | None = None
        self.n = 0
        self.distinct_cap = int(distinct_cap) if distinct_cap is not None else 16 * self.dim
        self._hashes: list[Tensor] = [torch.empty(0, dtype=torch.int64) for _ in range(self.num_layers)]
        self._distinct_stopped = [False] * self.num_layers
        # odd 64-bit multipliers: hash(row) = Σ_i bits(x_i) * m_i (mod 2^64), exact for identical rows
        g = torch.Generator().manual_seed(12345)
        self._mult = torch.randint(-2 ** 62, 2 ** 62, (self.dim,), generator=g, dtype=torch.int64) | 1
        self.mean: Tensor | None = None
        self.W: Tensor | None = None
        self.cov: Tensor | None = None
        self._eig: tuple[Tensor, Tensor] | None = None
        self.singular_values: Tensor | None = None
        self.rank: Tensor | None = None
        self.n_distinct: Tensor | None = None
        self.fit_info: WhiteningFit | None = None  # set by check()
        self.compact = False  # Σ and W stored in float32 in the sums' memory (finalize(release_sums=True))

    @property
    def out_dim(self) -> int:
        """Kept output dims k (d when ``k`` is None)."""
        return self.dim if self.k is None else int(self.k)

    def _as_lnd(self, x: Tensor) -> Tensor:
        if x.ndim == 2 and self.num_layers == 1:
            x = x.unsqueeze(0)
        if x.ndim != 3 or x.shape[0] != self.num_layers or x.shape[-1] != self.dim:
            raise ValueError(f"expected vectors [L={self.num_layers}, N, d={self.dim}] "
                             f"(or [N, d] when L=1), got {tuple(x.shape)}.")
        return x

    def partial_fit(self, x: Tensor) -> "Whitener":
        """Accumulate a chunk of training vectors ``[L, N, d]``; returns self."""
        if self.sum_outer is None:
            raise ValueError("this Whitener's sums were released by finalize(release_sums=True): it takes no more "
                             "vectors (fit a new one)")
        x = self._as_lnd(x).detach().to(torch.float64)  # reduce on x's device, move only [L, d(, d)]
        if x.shape[1] == 0:
            return self
        if self.shift is None:
            self.shift = x[:, :1].clone()  # [L, 1, d]
        self._track_distinct(x)
        x = x - self.shift.to(x.device)
        self.sum += x.sum(1).to(self.sum.device)
        self.sum_outer += gram(x).to(self.sum.device)  # the upper triangle only: 5/8 of a GEMM's work
        self.n += x.shape[1]
        self.mean = self.W = self.cov = self._eig = None  # stale until finalize()
        self.singular_values = self.rank = self.n_distinct = None
        return self

    def _track_distinct(self, x: Tensor) -> None:
        full = [h.numel() >= self.distinct_cap for h in self._hashes]
        self._distinct_stopped = [s or f for s, f in zip(self._distinct_stopped, full)]  # later rows unseen
        if all(full):
            return
        bits = (x + 0.0).contiguous().view(torch.int64)  # + 0.0 maps -0.0 to 0.0
        h = (bits * self._mult.to(x.device)).sum(-1).cpu()  # [L, N]; int64 wrap-around = mod 2^64
        for layer in range(self.num_layers):
            if not full[layer]:
                self._hashes[layer] = torch.unique(torch.cat([self._hashes[layer], h[layer]]))

    def fit(self, x: Tensor) -> "Whitener":
        """One-shot ``partial_fit`` + ``finalize``."""
        return self.partial_fit(x).finalize()

    def finalize(self, release_sums: bool = False, keep_eigvecs: bool = True) -> "Whitener":
        """Compute μ, Σ and W (of ``method``) from the accumulated sums, one layer at a time in float64; returns self.

        ``release_sums`` (``evaluate.py``'s one-shot fit, ``compact``): each layer's Σ and W are stored as float32 in
        the memory its float64 Σxxᵀ occupied, so no second ``(L+1)·d²`` array is allocated (43 GB at 70B); the sums are
        gone (no later ``partial_fit``).  False: float64 Σ and W, sums kept.  ``keep_eigvecs``: keep Σ's eigenvectors
        for ``derive`` (otherwise a derived whiten/abtt recomputes them — the same numbers).
        """
        if self.n < 2:
            raise ValueError(f"{self.method} needs at least 2 fit vectors, got {self.n}.")
        mean_shifted = self.sum / self.n
        num_layers, dim = self.num_layers, self.dim
        packed, from_sums = None, self.cov is None
        if from_sums:
            if self.sum_outer is None:
                raise ValueError("this Whitener's sums were released by finalize(release_sums=True): nothing to fit")
            if release_sums:  # layer l's float64 block of Σxxᵀ becomes [Σ_l, W_l] in float32
                packed = self.sum_outer.view(torch.float32).view(num_layers, 2, dim, dim)
                self.compact = True
            else:
                self.cov = torch.empty_like(self.sum_outer)
            self._eig = None
        needs_vectors = self.method in ("whiten", "abtt")
        vals, vecs = self._eig if self._eig is not None else (None, None)
        fresh = vals is None
        if fresh:
            vals = torch.empty(num_layers, dim, dtype=torch.float64, device=self.sum.device)
            vecs = torch.empty(num_layers, dim, dim, dtype=torch.float64, device=self.sum.device) \
                if keep_eigvecs else None
        W = None
        for layer in range(num_layers):
            if from_sums:
                cov = self._layer_covariance(layer, mean_shifted)  # float64 [1, d, d]
                if packed is None:
                    self.cov[layer] = cov[0]
            else:
                cov = self.cov[layer:layer + 1].to(torch.float64)
            if fresh or (needs_vectors and vecs is None):
                # Σ is symmetric PSD, so its SVD is its eigendecomposition; eigh is ~7x faster than svd.
                # eigh sorts ascending: flip to the descending order of the SVD.
                ev, eu = torch.linalg.eigh(cov)
                ev, eu = ev.flip(-1).clamp_min(0.0), eu.flip(-1)
                if fresh:
                    vals[layer] = ev[0]
                    if vecs is not None:
                        vecs[layer] = eu[0]
            else:
                ev, eu = vals[layer:layer + 1], (vecs[layer:layer + 1] if vecs is not None else None)
            w = affine_matrix(self.method, cov, ev, eu, k=self.k, abtt_d=self.abtt_d, eps=self.eps)
            if packed is not None:  # this layer's sums were read into `cov` above: its block is free now
                packed[layer, 0] = cov[0]
                packed[layer, 1, :, :w.shape[-1]] = w[0]
                continue
            if W is None and isinstance(self.cov, DiskLayers):  # a map derived from Σ on disk goes there too
                W = DiskLayers(num_layers, *w.shape[1:], directory=self.cov.directory)
            elif W is None:
                W = torch.empty(num_layers, *w.shape[1:], device=w.device,
                                dtype=torch.float32 if self.compact else torch.float64)
            W[layer] = w[0]
        if packed is not None:
            self.cov, W = packed[:, 0], packed[:, 1, :, :self.out_dim]
            self.sum_outer = None
        self._eig = (vals, vecs)
        self.mean = mean_shifted + self.shift[:, 0].to(mean_shifted.device)
        self.singular_values = vals
        tol = vals[:, :1] * self.dim * 1e4 * torch.finfo(torch.float64).eps
        self.rank = (vals > tol).sum(1).cpu()
        self.n_distinct = torch.tensor([h.numel() for h in self._hashes])
        self.distinct_exact = torch.tensor([not s for s in self._distinct_stopped])
        self.W = W
        return self

    @classmethod
    def fit_by_layer(cls, num_layers: int, dim: int, chunks: Callable[[int], Iterable[Tensor]], *,
                     k: int | None = None, eps: float = 1e-10, distinct_cap: int | None = None,
                     method: str = "whiten", keep_cov: bool = True,
                     on_disk: str | bool | None = None) -> "Whitener":
        """Fit every layer from its own stream: ``chunks(layer)`` yields that layer's ``[N, d]`` vectors, in the same
        chunks and order for every layer.

        Equals ``partial_fit`` on ``[L, N, d]`` chunks then ``finalize(release_sums=True)`` (same sums, same order), but
        the float64 sums exist for one layer at a time instead of ``(L+1)·d²`` beside the model.  ``keep_cov=False``
        keeps only W (Σ is what IsoScore and ``derive`` read).  ``on_disk`` (True = ``$TMPDIR``, or a directory): Σ and
        W go to ``outlierlab.utils.disk_layers.DiskLayers`` files, read back a layer at a time (40 GiB saved at 70B), as
        do the maps ``derive`` fits from it.  The numbers are the same.
        """
        out = cls(num_layers, dim, k=k, eps=eps, distinct_cap=distinct_cap, method=method, allocate=False)
        k_out = out.out_dim
        # two contiguous blocks (a strided W would be copied by every batched product)
        if on_disk:
            where = None if on_disk is True else on_disk
            cov32 = DiskLayers(num_layers, dim, dim, directory=where) if keep_cov else None
            w32 = DiskLayers(num_layers, dim, k_out, directory=where)
        else:
            cov32 = torch.empty(num_layers, dim, dim, dtype=torch.float32) if keep_cov else None
            w32 = torch.empty(num_layers, dim, k_out, dtype=torch.float32)
        parts: dict[str, list] = {name: [] for name in ("sum", "shift", "mean", "singular_values", "rank",
                                                        "n_distinct", "distinct_exact", "_hashes",
                                                        "_distinct_stopped")}
        for layer in range(num_layers):
            one = cls(1, dim, k=k, eps=eps, distinct_cap=distinct_cap, method=method)
            for x in chunks(layer):
                one.partial_fit(x[None] if x.ndim == 2 else x)
            if layer and one.n != out.n:
                raise ValueError(f"fit_by_layer: layer {layer} got {one.n} vectors, layer 0 got {out.n}")
            out.n = one.n
            one.finalize(release_sums=True, keep_eigvecs=False)
            if cov32 is not None:
                cov32[layer] = one.cov[0]
            w32[layer] = one.W[0]
            one.cov = one.W = None  # this layer's float64 block goes before the next layer's is summed
            # glibc keeps the freed d x d blocks and chunk copies (each under its 32 MiB mmap threshold) in the
            # heap and the next layer's land elsewhere: measured 100-500 MiB held after 19 layers at d = 2048
            release_freed_memory()
            for name, got in parts.items():
                got.append(getattr(one, name)[0])
        for name, got in parts.items():  # the tensors stacked over layers, the per-layer lists joined
            setattr(out, name, got if name.startswith("_") else torch.stack(got))
        out.cov, out.W, out.compact = cov32, w32, True
        out._eig = (out.singular_values, None)
        return out

    def _layer_covariance(self, layer: int, mean_shifted: Tensor) -> Tensor:
        """Σ of one layer (ddof = 1, symmetrised), float64 ``[1, d, d]``, from the shifted sums."""
        m = mean_shifted[layer]
        c = (self.sum_outer[layer] - self.n * torch.outer(m, m)) / (self.n - 1)
        return (0.5 * (c + c.T))[None]  # symmetric up to rounding

    def derive(self, method: str, k: int | None = None, abtt_d: int | None = None) -> "Whitener":
        """Another fitted map (``outlierlab.metrics.postprocessing``) from the same sums, finalized: one
        streaming pass fits whiten, standardize, abtt and center at once (Σ and its eigendecomposition are
        computed once and shared)."""
        if self.n < 2:
            raise ValueError(f"{method} needs at least 2 fit vectors, got {self.n}.")
        if self.W is None:
            self.finalize()
        other = Whitener(self.num_layers, self.dim, k=k, eps=self.eps, distinct_cap=self.distinct_cap,
                         method=method, abtt_d=abtt_d)
        other.sum, other.sum_outer, other.shift, other.n = self.sum, self.sum_outer, self.shift, self.n
        other._hashes, other._distinct_stopped = self._hashes, self._distinct_stopped
        other.cov, other._eig, other.compact = self.cov, self._eig, self.compact
        return other.finalize()

    def release_fit_state(self) -> None:
        """Once the maps are fitted: drop Σxxᵀ and Σ's eigenvectors ((L+1)·d² float64 each); kept: the mean, W,
        Σ (IsoScore) and the eigenvalues."""
        self.sum_outer, self._eig = None, None

    def release_maps(self) -> None:
        """Drop W, Σ and their cached copies (``[L, d, d]`` each, or their files) once nothing reads them; kept:
        the mean, the fit description and every count."""
        self.W = self.cov = self._eig = None
        self._applied_cache = None

    def check(self, what: str, min_ratio: float = MIN_FIT_RATIO, allow_degenerate: bool = False) -> WhiteningFit:
        """Refuse a fit on too few distinct vectors for the dims it keeps (one line), or return what it was fitted
        on: ``outlierlab.metrics.fit_guard.check_fit``, where the threshold is explained."""
        return check_fit(self, what, min_ratio, allow_degenerate)

    def transform(self, x: Tensor) -> Tensor:
        """``\hat x = (x-\mu)W`` for ``x`` [L, ..., d] (or [N, d] when L=1), in ``x``'s dtype (float64 stays float64,
        everything else float32)."""
        if self.W is None:
            raise ValueError("Whitener is not fitted: call partial_fit(...) then finalize() first.")
        squeeze = x.ndim == 2 and self.num_layers == 1
        xx = x.unsqueeze(0) if squeeze else x
        if xx.ndim < 3 or xx.shape[0] != self.num_layers or xx.shape[-1] != self.dim:
            raise ValueError(f"expected vectors [L={self.num_layers}, ..., d={self.dim}], got {tuple(x.shape)}.")
        cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        shape = xx.shape
        flat = xx.reshape(shape[0], -1, shape[-1]).to(cdt)
        if isinstance(self.W, DiskLayers):  # one layer's W in memory at a time
            mu = self.mean.to(device=x.device, dtype=cdt)
            out = torch.stack([(flat[i] - mu[i]) @ self.W[i].to(device=x.device, dtype=cdt)
                               for i in range(self.num_layers)])
        else:
            mu, w = self._applied(x.device, cdt)
            out = (flat - mu) @ w
        out = out.reshape(*shape[:-1], out.shape[-1]).to(x.dtype)
        return out.squeeze(0) if squeeze else out

    def _applied(self, device, dtype) -> tuple[Tensor, Tensor]:
        """μ [L, 1, d] and W in the dtype/device of the vectors, converted once per fit: a float32 copy of
        the float64 W for every batch cost as much as the product itself."""
        c = getattr(self, "_applied_cache", None)
        if c is None or c[0] is not self.W or c[1] is not self.mean or c[2] != (device, dtype):
            w = self.W.to(device=device, dtype=dtype)
            # a batched product copies a W strided across layers (the two-pass fit's [Σ, W] blocks) every call
            c = (self.W, self.mean, (device, dtype), self.mean.to(device=device, dtype=dtype).unsqueeze(1),
                 w if w.is_contiguous() else w.contiguous())
            self._applied_cache = c
        return c[3], c[4]

    # -- caching --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to rebuild the fitted transform (tensors + plain values; torch.save-able)."""
        return self._state(lambda W: W.cpu())

    def _state(self, w_of) -> dict:
        if self.W is None:
            raise ValueError("Whitener is not fitted: nothing to save.")
        return {"num_layers": self.num_layers, "dim": self.dim, "k": self.k, "eps": self.eps, "n": self.n,
                "method": self.method, "abtt_d": self.abtt_d,
                "mean": self.mean.cpu(), "W": w_of(self.W), "singular_values": self.singular_values.cpu(),
                "rank": self.rank, "n_distinct": self.n_distinct, "distinct_cap": self.distinct_cap}

    def load_state_dict(self, state: dict) -> "Whitener":
        """Load a fitted transform from ``state_dict`` into this instance (shapes must match); returns self."""
        other = Whitener.from_state_dict(state)
        if (other.num_layers, other.dim) != (self.num_layers, self.dim):
            raise ValueError(f"whitening state is for L={other.num_layers}, d={other.dim}; "
                             f"this Whitener is L={self.num_layers}, d={self.dim}.")
        self.k, self.eps, self.n, self.method, self.abtt_d = other.k, other.eps, other.n, other.method, other.abtt_d
        self.mean, self.W, self.singular_values = other.mean, other.W, other.singular_values
        self.rank, self.n_distinct, self.distinct_cap = other.rank, other.n_distinct, other.distinct_cap
        return self

    @classmethod
    def from_state_dict(cls, state: dict) -> "Whitener":
        """Rebuild a fitted Whitener from ``state_dict`` (running sums are not restored)."""
        missing = {"num_layers", "dim", "k", "eps", "n", "mean", "W"} - set(state)
        if missing:
            raise ValueError(f"whitening state is missing keys {sorted(missing)}.")
        w = cls(state["num_layers"], state["dim"], state["k"], state["eps"], distinct_cap=state.get("distinct_cap"),
                method=state.get("method", "whiten"), abtt_d=state.get("abtt_d"))
        W = state["W"]  # a compact fit's float32 W stays float32 (and a selected layer stays a view)
        w.n, w.mean = state["n"], state["mean"].to(torch.float64)
        w.W = W if W.dtype in (torch.float32, torch.float64) else W.to(torch.float64)
        w.singular_values = state.get("singular_values")
        w.rank, w.n_distinct = state.get("rank"), state.get("n_distinct")
        return w

    def select(self, layers: Sequence[int]) -> "Whitener":
        """The fitted whitener of some layers only (probing a subset of layers)."""
        layers = list(layers)
        # a run of consecutive layers is a view (the replay selects one layer at a time: a copy of W per
        # layer would double the (L+1)·d² float64 state); on disk, only those layers are read
        if layers and layers == list(range(layers[0], layers[0] + len(layers))):
            layers = slice(layers[0], layers[0] + len(layers))
        st = self._state(lambda W: W if isinstance(W, DiskLayers) else W.cpu())  # W[layers] reads only those
        st.update(num_layers=len(range(self.num_layers)[layers]) if isinstance(layers, slice) else len(layers),
                  mean=st["mean"][layers], W=st["W"][layers],
                  singular_values=st["singular_values"][layers],
                  rank=None if st["rank"] is None else st["rank"][layers],
                  n_distinct=None if st["n_distinct"] is None else st["n_distinct"][layers])
        return Whitener.from_state_dict(st)
