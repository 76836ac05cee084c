"""Across-seed statistics: the mean of a quantity over independent training runs and how far to trust it.

A claim about position schemes or switches is a contrast between groups of runs differing only in their seed
(docs/design.md, "compare"); the spread across seeds is its only error bar.

* ``summarize`` -- n, mean, sample std, a 95 % interval of the mean from Student's t with n - 1 df (few seeds:
  t_{0.975, 2} = 4.30 for three vs 1.96), min and max.
* ``contrast`` -- the difference of two groups' means with its interval: paired t when both hold the same seeds
  (shared data order, masks and init cancel), Welch's t otherwise; its p; and whether the ordering holds in every
  seed (paired) or every run of one group lies above the other's (unpaired).

Zero variance has no interval and no test: NaN with "constant across seeds", never a zero-width interval and p = 0.
Values differing only by float rounding (``ROUNDING``) are the same value (scipy's moments lose every digit on them).
Welch with one group constant is the one-sample t of the other (n - 1 df), computed as such.  Pairing uses the shared
seeds; Welch only below two.  Corrections, power, equivalence: ``studies.study_inference``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
CI_METHOD = "Student t, 95%"
CONSTANT = "constant across seeds"
#: Values whose spread is at most this share of their largest magnitude are one value (float rounding).
ROUNDING = 1e-12


def is_constant(values: Sequence[float]) -> bool:
    """Two or more values equal up to float rounding (``ROUNDING``): no spread to test or to put an interval on."""
    x = np.asarray(values, dtype=np.float64)
    return x.size > 1 and float(np.ptp(x)) <= ROUNDING * float(np.abs(x).max())


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float:
    """``sqrt(((n_a-1)s_a² + (n_b-1)s_b²) / (n_a+n_b-2))``; NaN below two values per group."""
    xa, xb = np.asarray(a, float), np.asarray(b, float)
    if xa.size < 2 or xb.size < 2:
        return math.nan
    return float(math.sqrt(((xa.size - 1) * xa.var(ddof=1) + (xb.size - 1) * xb.var(ddof=1)) / (xa.size + xb.size - 2)))


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    min: float
    max: float
    note: str = ""


def t_halfwidth(std: float, n: int, confidence: float = CONFIDENCE) -> float:
    """Half-width of the t confidence interval of a mean: ``t_{(1+c)/2, n-1} · std / sqrt(n)``; NaN for n < 2."""
    if n < 2 or not math.isfinite(std):
        return math.nan
    return float(stats.t.ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n))


def summarize(values: Sequence[float], confidence: float = CONFIDENCE) -> Summary:
    """Mean over seeds with its t confidence interval (non-finite values are dropped, and counted out of n).

    Examples
    --------
    >>> s = summarize([1.0, 2.0, 3.0])
    >>> round(s.std, 6), round(s.ci_high - s.mean, 4)   # std 1, t_{0.975,2} = 4.3027 -> 4.3027/sqrt(3)
    (1.0, 2.4841)
    """
    x = np.asarray([v for v in values if v is not None and math.isfinite(float(v))], dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else math.nan
    constant = is_constant(x)
    h = math.nan if constant else t_halfwidth(std, n, confidence)
    return Summary(n, mean, std, mean - h, mean + h, float(x.min()), float(x.max()), CONSTANT if constant else "")


@dataclass(frozen=True)
class Contrast:
    test: str            # "paired t" or "Welch t"
    n_a: int
    n_b: int
    diff: float          # paired: mean of the per-seed differences over the shared seeds; Welch: mean(a) - mean(b)
    ci_low: float
    ci_high: float
    p_value: float
    same_order: bool     # paired: every seed's difference has the sign of `diff`; unpaired: the groups do not overlap
    order_count: str     # e.g. "3/3 seeds a > b" or "a > b in every pair of runs"
    n_pairs: int = 0     # paired: the seeds both groups hold (the test's n)
    sd: float = math.nan  # paired: sd of the differences; Welch: the pooled sd (what the power analysis uses)
    note: str = ""       # "constant across seeds", "paired over seeds 1, 3 (b lacks 2)", ...


def contrast(a: Mapping[int, float], b: Mapping[int, float], confidence: float = CONFIDENCE) -> Contrast:
    """Group ``a`` minus group ``b``, each a mapping seed -> value.

    Paired (≥ 2 shared seeds): the mean of d_s = a_s - b_s over the shared seeds, its t interval and
    ``scipy.stats.ttest_rel``; unshared seeds are named in ``note``.  Otherwise Welch: ``se = sqrt(s_a²/n_a +
    s_b²/n_b)`` with Welch–Satterthwaite df.  Zero variance: interval and p NaN, ``note`` "constant across seeds".
    """

    a = {k: float(v) for k, v in a.items() if math.isfinite(float(v))}
    b = {k: float(v) for k, v in b.items() if math.isfinite(float(v))}
    if not a or not b:
        raise ValueError("a contrast needs at least one finite value in each group")
    shared = sorted(set(a) & set(b))
    if len(shared) >= 2:
        d = np.array([a[s] - b[s] for s in shared])
        s = summarize(d, confidence)
        note = s.note
        if s.note != CONSTANT and s.std > 0:
            p = float(stats.ttest_rel([a[k] for k in shared], [b[k] for k in shared]).pvalue)
        else:
            p = math.nan
            note = CONSTANT
        lost = [f"{g} lacks {', '.join(map(str, sorted(set(other) - set(shared))))}"
                for g, other in (("a", b), ("b", a)) if set(other) - set(shared)]
        if lost:
            note = "; ".join(x for x in (note, f"paired over seeds {', '.join(map(str, shared))} ({'; '.join(lost)})") if x)
        sign = np.sign(d)
        lead = np.sign(s.mean)
        common = dict(n_pairs=len(shared), sd=s.std, note=note)
        if lead == 0:
            equal = int((sign == 0).sum())
            return Contrast("paired t", len(a), len(b), s.mean, s.ci_low, s.ci_high, p, False,
                            f"a = b in {equal}/{len(d)} seeds" if equal else "no mean difference", **common)
        agree = int((sign == lead).sum())
        word = ">" if lead > 0 else "<"
        return Contrast("paired t", len(a), len(b), s.mean, s.ci_low, s.ci_high, p,
                        bool(agree == len(d)), f"{agree}/{len(d)} seeds a {word} b", **common)
    xa, xb = np.array(list(a.values())), np.array(list(b.values()))
    diff = float(xa.mean() - xb.mean())
    # a group constant up to rounding has no variance: its rounding noise is not a spread between seeds
    va = (0.0 if is_constant(xa) else xa.var(ddof=1) / xa.size) if xa.size > 1 else math.nan
    vb = (0.0 if is_constant(xb) else xb.var(ddof=1) / xb.size) if xb.size > 1 else math.nan
    se = math.sqrt(va + vb) if math.isfinite(va + vb) else math.nan
    note = ""
    if math.isfinite(se) and se > 0:
        df = (va + vb) ** 2 / (va ** 2 / (xa.size - 1) + vb ** 2 / (xb.size - 1))
        h = float(stats.t.ppf(0.5 + confidence / 2, df) * se)
        if va == 0 or vb == 0:  # Welch with one constant group: the other group's one-sample t against it
            varying, constant = (xb, xa) if va == 0 else (xa, xb)
            p = float(stats.ttest_1samp(varying, float(constant.mean())).pvalue)
        else:
            p = float(stats.ttest_ind(xa, xb, equal_var=False).pvalue)
    else:
        h, p = math.nan, math.nan
        note = CONSTANT if se == 0 else ""
    above, below = bool(xa.min() > xb.max()), bool(xa.max() < xb.min())
    order = "a > b in every pair of runs" if above else ("a < b in every pair of runs" if below else "the groups overlap")
    return Contrast("Welch t", int(xa.size), int(xb.size), diff, diff - h, diff + h, p, above or below, order,
                    0, pooled_sd(xa, xb), note)
