"""Is a fitted whitening (or standardize / all-but-the-top / center) map trustworthy?  The sample-size guard of
``Whitener.check``: a fit on too few distinct vectors is refused in one line (or kept, marked degenerate), and what it
was fitted on becomes CSV columns.  It reads a fitted ``Whitener`` and changes only its ``fit_info``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from outlierlab.metrics.postprocessing import CITATION, fit_size

__all__ = ["MIN_FIT_RATIO", "DegenerateWhiteningError", "WhiteningFit", "check_fit"]

#: Default for :func:`check_fit`: distinct fit vectors per kept dimension (see there for why 2).
MIN_FIT_RATIO = 2.0


class DegenerateWhiteningError(ValueError):
    """Whitening was fitted on too few distinct vectors for the dims it is asked to keep (one-line message).

    For callers that word it their own way: ``problem``, ``need`` and ``found`` (distinct fit ``unit``s), ``method``,
    ``fixes`` (overrides that make the fit pass, e.g. ``transform.k=24``) and ``texts`` (the caller's texts behind the
    fit; None for a data set's own pairs).
    """

    def __init__(self, message: str, *, problem: str = "", need: int | None = None, found: int | None = None,
                 unit: str = "vectors", fixes: tuple[str, ...] = (), method: str = "whiten") -> None:
        super().__init__(message)
        self.problem, self.need, self.found, self.unit = problem or message, need, found, unit
        self.method = method
        self.fixes, self.texts = tuple(fixes), None


@dataclass
class WhiteningFit:
    """What a whitener was fitted on, for CSV rows and reports (``Whitener.check``).

    ``n_distinct`` is exact up to ``distinct_cap`` and reported as ">= cap" beyond; ``rank`` is the numerical
    rank of Σ (smallest over layers); ``k`` the kept output dims.
    """

    what: str
    n: int
    n_distinct: int
    distinct_capped: bool
    rank: int
    k: int
    dim: int
    min_ratio: float
    degenerate: bool = False
    reason: str = ""
    method: str = "whiten"
    abtt_d: int | None = None

    def columns(self) -> dict:
        """CSV columns of a fitted row, prefixed by the method (``whiten_n``, ``abtt_n``, ...); ``whiten_k`` for
        whitening, ``abtt_d`` for all-but-the-top."""
        m = self.method
        cols = {f"{m}_fit": self.what, f"{m}_n": self.n,
                f"{m}_distinct": f">={self.n_distinct}" if self.distinct_capped else self.n_distinct,
                f"{m}_rank": self.rank}
        if m == "whiten":
            cols["whiten_k"] = self.k
        if m == "abtt":
            cols["abtt_d"] = self.abtt_d
        cols[f"{m}_degenerate"] = self.degenerate
        return cols

    def describe(self) -> str:
        distinct = f">= {self.n_distinct}" if self.distinct_capped else str(self.n_distinct)
        param = {"whiten": f", k={self.k}", "abtt": f", D={self.abtt_d}"}.get(self.method, "")
        line = (f"fit on {self.what}: {self.n} vectors, {distinct} distinct, rank {self.rank} of {self.dim}"
                f"{param} ({CITATION[self.method]})")
        return line + (f" — **DEGENERATE** ({self.reason}; kept by transform.allow_degenerate=true)"
                       if self.degenerate else "")


def check_fit(w, what: str, min_ratio: float = MIN_FIT_RATIO, allow_degenerate: bool = False) -> WhiteningFit:
    r"""Refuse a whitening fitted on too few distinct vectors for the ``k`` dims it keeps.

    Why N_distinct ≥ ``min_ratio`` · k (default 2):

    * N distinct points span at most N−1 dims.  With k ≥ N−1 the whitened fit points satisfy ZZᵀ = (N−1)(I − 11ᵀ/N):
      equal norms and pairwise cosine −1/(N−1), a regular simplex, so any similarity on them is noise, and a new vector
      is divided by √ε in the unseen directions.  N_distinct ≤ k is always wrong.
    * Above that, the smallest of k sample eigenvalues is biased low: λ_min/λ ≈ (1 − √(k/N))² (Marchenko–Pastur),
      0.09 at N = 2k (that direction blown up ≈ 3.4×).  2k is also where Su et al. 2021 operate (k = 256 of 768 on a few
      thousand STS sentences).

    The numerical rank is reported, not judged (a post-LayerNorm layer has rank d−1 whatever N).  ``what``: the fit
    data, for the message and CSV; ``allow_degenerate`` returns the fit marked ``degenerate`` instead of raising
    ``DegenerateWhiteningError`` (whose line names the fixes: ``transform.fit_on=sentences``, a larger split, a smaller
    ``transform.k=``, or ``transform.allow_degenerate=true``).
    """
    if w.W is None:
        raise ValueError("Whitener is not fitted: call finalize() first.")
    if w.method != "whiten":
        return _check_other(w, what, min_ratio, allow_degenerate)
    n_distinct, capped = _fewest_distinct(w)
    k, need = w.out_dim, math.ceil(float(min_ratio) * w.out_dim)
    fit = WhiteningFit(what, w.n, n_distinct, capped, int(w.rank.min()), k, w.dim, float(min_ratio),
                       method="whiten")
    w.fit_info = fit  # what this whitener was fitted on, for whoever applies it (CSV columns)
    if capped or n_distinct >= need:  # capped: at least distinct_cap = 16 d, enough for any sane ratio
        return fit
    k_ok = max(1, int(n_distinct // float(min_ratio)))
    fit.reason = (f"{n_distinct} distinct vectors < {float(min_ratio):g} x k={k}"
                  + (" (fewer than the dims: the whitened points form a regular simplex, every cosine equal)"
                     if n_distinct <= k else ""))
    if allow_degenerate:
        fit.degenerate = True
        return fit
    problem = (f"whitening fit on {what} is degenerate: {w.n} vectors, {n_distinct} distinct, rank {fit.rank} of "
               f"{w.dim}, k={k} — {fit.reason}")
    raise DegenerateWhiteningError(
        f"{problem}; fit on more distinct data (a larger training split; in evaluate.py also "
        f"transform.fit_on=sentences), or keep fewer dims with transform.k={k_ok} or less (Su et al. 2021 keep 256 "
        "of 768), or keep this result marked degenerate with transform.allow_degenerate=true",
        problem=problem, need=need, found=n_distinct, fixes=(f"transform.k={k_ok}",))


def _fewest_distinct(w) -> tuple[int, bool]:
    """The fewest distinct fit vectors of any layer, and whether that count stopped at ``distinct_cap``."""
    low = int(w.n_distinct.argmin())
    exact = getattr(w, "distinct_exact", None)
    n_distinct = int(w.n_distinct[low])
    return n_distinct, n_distinct >= w.distinct_cap and (exact is None or not bool(exact[low]))


def _check_other(w, what: str, min_ratio: float, allow_degenerate: bool) -> WhiteningFit:
    """``check_fit`` for standardize / abtt / center: N_distinct ≥ min_ratio · p with p the directions the
    fit estimates (``outlierlab.metrics.postprocessing.fit_size``, where the module docstring says
    what goes wrong below it)."""
    n_distinct, capped = _fewest_distinct(w)
    p = fit_size(w.method, w.dim, abtt_d=w.abtt_d)
    need = math.ceil(float(min_ratio) * p)
    fit = WhiteningFit(what, w.n, n_distinct, capped, int(w.rank.min()), w.dim, w.dim,
                       float(min_ratio), method=w.method, abtt_d=w.abtt_d)
    w.fit_info = fit
    if capped or n_distinct >= need:
        return fit
    what_p = {"abtt": f"the mean and D={w.abtt_d} principal directions", "standardize": "a mean and a scale per dim",
              "center": "the mean"}[w.method]
    fit.reason = (f"{n_distinct} distinct vectors < {float(min_ratio):g} x {p} (it estimates {what_p})"
                  + (": every fitted vector degenerates" if n_distinct <= p else ""))
    if allow_degenerate:
        fit.degenerate = True
        return fit
    fixes = (f"transform.abtt_d={max(0, int(n_distinct // float(min_ratio)) - 1)}",) if w.method == "abtt" else ()
    fix = f"or remove fewer directions with {fixes[0]}, " if fixes else ""
    problem = f"{w.method} fit on {what} is degenerate: {w.n} vectors, {n_distinct} distinct — {fit.reason}"
    raise DegenerateWhiteningError(
        f"{problem}; fit on more distinct data (a larger training split; in evaluate.py also "
        f"transform.fit_on=sentences), {fix}or keep this result marked degenerate with transform.allow_degenerate=true",
        problem=problem, need=need, found=n_distinct, fixes=fixes, method=w.method)
