"""What a seed study may claim: corrected p-values, the smallest effect it could see, equivalence, and intervals that
respect a measure's range.  Every number comes from statsmodels or scipy; this fixes the protocol.

* ``adjust_pvalues`` -- Holm's step-down correction (Holm 1979; the primary family) or Benjamini & Hochberg's
  q-values (1995; every other contrast), via ``multipletests``; NaN p-values stay NaN, outside the family.
* ``minimum_detectable_effect`` -- the smallest true difference a two-sided t-test at 0.05 detects with 80 % power:
  paired from the sd of per-seed differences (``TTestPower``), unpaired from the pooled sd (``TTestIndPower``, the
  usual planning approximation for Welch).  A null result below it is absence of evidence.
* ``tost`` -- two one-sided tests of equivalence (Schuirmann 1987; Lakens 2017) within ``±margin``
  (``ttost_paired`` / ``ttost_ind``, Welch); p < 0.05 supports "no difference larger than the margin".
* ``bounded_interval`` -- a 95 % interval of a mean inside a measure's range (shares [0, 1], cosines [-1, 1]):
  bootstrap percentile over seeds when n >= 5, else Student t on the logit or Fisher-z scale mapped back (bound
  values pulled in by 1e-6).
* ``difference_range`` / ``clip_to_range`` -- a difference of two bounded measures lies in ``[lo - hi, hi - lo]``;
  its t interval (12.7 times the spread at n = 2) is clipped there, said in the note.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np
from scipy import stats

from outlierlab.studies.seed_statistics import is_constant

ALPHA = 0.05
POWER = 0.80
BOOTSTRAP_MIN_N = 5
BOOTSTRAP_RESAMPLES = 9999
_EDGE = 1e-6

#: Metric-name patterns of bounded measures -> their range (matched against the last part of the name).
BOUNDED = ((re.compile(r"(share|isoscore|accuracy|row_mass)$"), (0.0, 1.0)),
           (re.compile(r"(anisotropy|cosine|anisotropy_one_per_sentence)$"), (-1.0, 1.0)))


def adjust_pvalues(p: Sequence[float], method: str) -> np.ndarray:
    """Holm-adjusted p (``method="holm"``) or BH q-values (``"fdr_bh"``) over the finite entries of ``p``.

    Examples
    --------
    >>> adjust_pvalues([0.01, 0.04, 0.03], "holm").round(4).tolist()   # 3·0.01, max(2·0.03, 0.03), max(1·0.04, 0.06)
    [0.03, 0.06, 0.06]
    """
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], alpha=ALPHA, method=method)[1]
    return out


def minimum_detectable_effect(n_a: int, n_b: int, sd: float, paired: bool, alpha: float = ALPHA,
                              power: float = POWER) -> float:
    """Smallest |difference| a two-sided t-test detects with ``power`` at level ``alpha``.

    Paired: ``sd`` is the standard deviation of the n per-seed differences, the effect d·sd with d solving
    the one-sample t power equation at n. Unpaired: ``sd`` is the pooled standard deviation, d from the
    two-sample power equation at n_a, n_b. NaN when it cannot be computed (n < 2 or sd not finite); 0 when sd = 0.
    """
    from statsmodels.stats.power import TTestIndPower, TTestPower

    if not math.isfinite(sd) or (paired and n_a < 2) or (not paired and min(n_a, n_b) < 2):
        return math.nan
    if sd == 0:
        return 0.0
    if paired:
        d = TTestPower().solve_power(effect_size=None, nobs=n_a, alpha=alpha, power=power, alternative="two-sided")
    else:
        d = TTestIndPower().solve_power(effect_size=None, nobs1=n_a, ratio=n_b / n_a, alpha=alpha, power=power,
                                        alternative="two-sided")
    return float(np.asarray(d).item() * sd)


def tost(a: Sequence[float], b: Sequence[float], margin: float, paired: bool) -> float:
    """p-value of the two one-sided tests that ``mean(a) - mean(b)`` lies within ``(-margin, margin)``; NaN for constant
    data (undefined t statistics) or too few values."""
    from statsmodels.stats.weightstats import ttost_ind, ttost_paired

    xa, xb = np.asarray(a, float), np.asarray(b, float)
    if not (margin > 0) or min(xa.size, xb.size) < 2:
        return math.nan
    if paired:
        if is_constant(xa - xb):
            return math.nan
        p = ttost_paired(xa, xb, -margin, margin)[0]
    else:
        if is_constant(xa) and is_constant(xb):
            return math.nan
        p = ttost_ind(xa, xb, -margin, margin, usevar="unequal")[0]
    return float(p)


def bounds_of(metric: str) -> tuple[float, float] | None:
    """The range of a bounded measure, from its name (``hidden/argmax_share`` -> (0, 1)); None if unbounded."""
    last = metric.rsplit("/", 1)[-1]
    for pattern, rng in BOUNDED:
        if pattern.search(last):
            return rng
    return None


def bounded_interval(values: Sequence[float], lo: float, hi: float, confidence: float = 0.95,
                     seed: int = 0) -> tuple[float, float, str]:
    """``(low, high, method)``: a confidence interval of the mean of values in ``[lo, hi]`` that stays inside it.

    n >= 5: bootstrap percentile over the seeds (fixed ``seed``, 9,999 resamples). 2 <= n < 5: Student t on the
    transformed values -- logit of ``(x - lo) / (hi - lo)`` for [0, 1]-type ranges, Fisher z = artanh for
    [-1, 1] -- mapped back. NaN with method ``"constant across seeds"`` when every value is the same.
    """

    x = np.asarray([v for v in values if math.isfinite(v)], float)
    if x.size < 2:
        return math.nan, math.nan, "n < 2"
    if is_constant(x):
        return math.nan, math.nan, "constant across seeds"
    level = f"{confidence:.0%}"
    if x.size >= BOOTSTRAP_MIN_N:
        res = stats.bootstrap((x,), np.mean, confidence_level=confidence, method="percentile",
                              n_resamples=BOOTSTRAP_RESAMPLES, random_state=np.random.default_rng(seed))
        return float(res.confidence_interval.low), float(res.confidence_interval.high), f"bootstrap percentile, {level}"
    u = np.clip((x - lo) / (hi - lo), _EDGE, 1 - _EDGE)
    fisher = lo == -1.0 and hi == 1.0
    z = np.arctanh(2 * u - 1) if fisher else np.log(u / (1 - u))
    h = stats.t.ppf(0.5 + confidence / 2, z.size - 1) * z.std(ddof=1) / math.sqrt(z.size)
    ends = np.array([z.mean() - h, z.mean() + h])
    back = (np.tanh(ends) + 1) / 2 if fisher else 1 / (1 + np.exp(-ends))
    name = "Fisher-z t" if fisher else "logit t"
    return float(lo + back[0] * (hi - lo)), float(lo + back[1] * (hi - lo)), f"{name}, {level}"


def difference_range(lo: float, hi: float) -> tuple[float, float]:
    """The range of a difference of two measures that each lie in ``[lo, hi]``."""
    return lo - hi, hi - lo


def clip_to_range(low: float, high: float, rng: tuple[float, float]) -> tuple[float, float, str]:
    """``(low, high, note)``: an interval cut at ``rng`` (NaN ends stay NaN), and a note when it was cut."""
    lo, hi = rng
    cut_low, cut_high = low < lo, high > hi
    if not (cut_low or cut_high):
        return low, high, ""
    return (max(low, lo), min(high, hi),
            f"CI clipped at the range of the difference [{lo:g}, {hi:g}] (t interval {low:.3g} to {high:.3g})")


#: Performance measures -- training and validation loss, accuracy, perplexity, order use (a loss difference) --
#: differ between almost any two trained groups at almost every step; pooled with outlier measures they would make
#: Benjamini-Hochberg lenient for everything else, so they are never in an outlier claim's family.
PERFORMANCE = re.compile(r"(^train/|(^|/)(loss|acc|accuracy|ppl|perplexity|order_use)$)")
#: The confirmatory family when no outlier measure is declared (declaring only performance measures leaves it at
#: this): the outlier measures of docs/outlier_metrics.md at the most concentrated layer (``max_layer``, taken within
#: each run) and the model's LayerNorm outlier count.
DEFAULT_PRIMARY = [("hidden/kurtosis", "max_layer"), ("hidden/max_median", "max_layer"),
                   ("hidden/argmax_share", "max_layer"), ("hidden/abs_argmax_share", "max_layer"),
                   ("hidden/inf_norm_ffn_output", "max_layer"), ("layernorm/n_outlier_dims", "model"),
                   ("posthoc/kurtosis", "max_layer"), ("posthoc/max_median", "max_layer"),
                   ("posthoc/argmax_share", "max_layer"), ("posthoc/abs_argmax_share", "max_layer"),
                   ("posthoc/n_layernorm_outliers", "model")]
DEFAULT_RULE = ("the outlier measures at the last step every cell reached (no outlier measure declared): kurtosis, "
                "max/median, argmax share, |x| argmax share and FFN-output inf-norm at the most concentrated layer, "
                "and the LayerNorm outlier count")
PRIMARY, PERFORMANCE_FAMILY = "primary", "performance"
CONFIRMATORY = (PRIMARY, PERFORMANCE_FAMILY)
EXPLORATORY, EXPLORATORY_PERFORMANCE = "exploratory", "exploratory performance"
NOT_TESTED, DUPLICATE = "not tested", "duplicate"


def is_performance(metric: str) -> bool:
    """Loss, accuracy, perplexity and order use (``PERFORMANCE``): never in the family of an outlier claim."""
    return bool(PERFORMANCE.search(metric))


def family_rules(design: dict, present: set[tuple[str, str]] | None = None) -> dict[str, list[tuple[str, str]]]:
    """``{"primary": [(metric, layer)], "performance": [...]}``: the declared metric@layer split by kind -- outlier
    and geometry measures form the primary family, performance measures their own -- and, when no outlier measure is
    declared, ``DEFAULT_PRIMARY`` (those of it in ``present``, when given)."""
    declared = list(design.get("primary") or [])
    outlier = [x for x in declared if not is_performance(x[0])]
    default = not outlier
    if default:
        outlier = [x for x in DEFAULT_PRIMARY if present is None or x in present]
    return {"primary": outlier, "performance": [x for x in declared if is_performance(x[0])], "default": default}
