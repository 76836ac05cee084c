"""Corrected p-values, power, equivalence, bounded intervals, zero variance and pairing over shared seeds,
each against a value computed by hand (or by a different formula than the code's)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats

from outlierlab.studies.seed_statistics import contrast, summarize
from outlierlab.studies.study_inference import adjust_pvalues, bounded_interval, minimum_detectable_effect, tost
from outlierlab.studies import aggregate as study
from tests.study_fixtures import plant_study, row

P = [0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205]
# Holm: p_(i)·(m − i + 1), then the running maximum
HOLM = [0.008, 0.056, 0.234, 0.234, 0.234, 0.234, 0.234, 0.234]
# Benjamini–Hochberg: p_(i)·m / i, then the running minimum from the largest p down
BH = [0.008, 0.032, 0.0672, 0.0672, 0.0672, 0.08, 0.074 * 8 / 7, 0.205]


def test_holm_and_bh_equal_the_textbook_values_in_any_order():
    order = [5, 2, 7, 0, 3, 6, 1, 4]
    shuffled = [P[i] for i in order]
    assert adjust_pvalues(shuffled, "holm") == pytest.approx([HOLM[i] for i in order], abs=1e-12)
    assert adjust_pvalues(shuffled, "fdr_bh") == pytest.approx([BH[i] for i in order], abs=1e-12)
    from statsmodels.stats.multitest import multipletests  # and statsmodels itself agrees
    assert adjust_pvalues(P, "holm") == pytest.approx(multipletests(P, method="holm")[1])


def test_nan_p_values_are_outside_the_family():
    got = adjust_pvalues([0.01, math.nan, 0.04], "holm")
    assert got[0] == pytest.approx(0.02) and math.isnan(got[1]) and got[2] == pytest.approx(0.04)  # m = 2, not 3


def _analytic_mde(n: int, sd: float, paired: bool, n_b: int | None = None) -> float:
    """Solve the noncentral-t power equation directly (not statsmodels): power(δ) = 0.8 at α = 0.05."""
    if paired:
        df, scale = n - 1, sd / math.sqrt(n)
    else:
        df, scale = n + n_b - 2, sd * math.sqrt(1 / n + 1 / n_b)
    crit = stats.t.ppf(0.975, df)

    def power(delta):
        nc = delta / scale
        lower = stats.nct.cdf(-crit, df, nc)  # the far tail: ~0 (scipy returns NaN for large nc)
        return stats.nct.sf(crit, df, nc) + (0.0 if math.isnan(lower) else lower) - 0.8

    return optimize.brentq(power, 1e-9, 3 * scale * (crit + 3))


def test_minimum_detectable_effect_equals_the_analytic_value():
    assert minimum_detectable_effect(5, 5, 2.0, paired=True) == pytest.approx(_analytic_mde(5, 2.0, True), rel=1e-4)
    assert minimum_detectable_effect(4, 6, 0.5, paired=False) == pytest.approx(_analytic_mde(4, 0.5, False, 6), rel=1e-4)


def test_study_reports_the_mde_of_the_declared_primary_contrast(tmp_path):
    plant_study(tmp_path)
    res = study.run([str(tmp_path)], contrasts=["pos=learned,none"], plots=False,
                    primary=["hidden/kurtosis@layer_2"], equivalence_margin="hidden/kurtosis=20")
    c = pd.read_csv(res["out"] / "contrasts.csv")
    r = row(c, step=100, layer="layer_2", metric="hidden/kurtosis")
    d = np.array([2 - 1, 4 - 1.5, 9 - 2])  # per-seed differences of the planted groups
    sd = float(np.sqrt(((d - d.mean()) ** 2).sum() / 2))
    assert r["family"] == "primary" and r["sd"] == pytest.approx(sd)
    assert r["mde"] == pytest.approx(_analytic_mde(3, sd, True), rel=1e-4)
    assert r["p_holm"] == pytest.approx(r["p_value"])  # a family of one
    # TOST by hand: max of the two one-sided p-values against ±20
    se = sd / math.sqrt(3)
    p_low = stats.t.sf((d.mean() + 20) / se, 2)
    p_high = stats.t.cdf((d.mean() - 20) / se, 2)
    assert r["tost_p"] == pytest.approx(max(p_low, p_high), rel=1e-6)
    # everything else is exploratory (BH within its kind) or in none; step 0 (kurtosis 1.0 in every run) is not tested
    assert set(c["family"]) <= {"primary", "exploratory", "exploratory performance", "not tested", "duplicate"}
    r0 = row(c, step=0, layer="layer_2", metric="hidden/kurtosis")
    assert r0["family"] == "not tested" and math.isnan(r0["p_value"]) and r0["note"] == "constant across seeds"
    md = (res["out"] / "study.md").read_text()
    assert "**primary (outlier claims): 1 test** — rule: declared (--primary)" in md
    assert "metrics: hidden/kurtosis@layer_2; in pos=learned,none" in md  # the experiment config's, with --primary over its metrics


def test_tost_within_a_wide_margin_and_not_within_a_narrow_one():
    a, b = [1.0, 2.0, 3.0, 4.0], [1.1, 2.05, 2.9, 4.1]
    assert tost(a, b, 1.0, paired=True) < 0.01 and tost(a, b, 0.01, paired=True) > 0.5


def test_zero_variance_gives_nan_never_p_zero():
    s = summarize([0.5, 0.5, 0.5])
    assert math.isnan(s.ci_low) and math.isnan(s.ci_high) and s.note == "constant across seeds"
    c = contrast({1: 2.0, 2: 3.0, 3: 4.0}, {1: 1.0, 2: 2.0, 3: 3.0})  # every difference exactly 1
    assert c.diff == pytest.approx(1.0) and math.isnan(c.p_value) and math.isnan(c.ci_low)
    assert c.note == "constant across seeds"


def test_a_missing_seed_is_paired_over_the_shared_seeds():
    a = {1: 3.0, 2: 5.0, 3: 4.5, 4: 9.0}
    b = {1: 1.0, 2: 4.0, 4: 6.0}  # seed 3 missing in b
    c = contrast(a, b)
    ref = stats.ttest_rel([3.0, 5.0, 9.0], [1.0, 4.0, 6.0])
    assert c.test == "paired t" and c.n_pairs == 3 and c.p_value == pytest.approx(ref.pvalue, rel=1e-12)
    assert c.diff == pytest.approx(np.mean([2.0, 1.0, 3.0])) and "b lacks 3" in c.note


def test_study_pairs_over_shared_seeds_and_marks_the_row(tmp_path):
    plant_study(tmp_path)
    hist = tmp_path / "experiment=emergence_seeds,pos=learned,seed=3" / "monitor" / "hidden_states.csv"
    hist.write_text("\n".join(l for l in hist.read_text().splitlines() if not l.startswith("100,layer_2,kurtosis"))
                    + "\n")
    res = study.run([str(tmp_path)], contrasts=["pos=learned,none"], plots=False)
    s = pd.read_csv(res["out"] / "study.csv")
    r = row(s, group="pos=learned", step=100, layer="layer_2", metric="hidden/kurtosis")
    assert r["n"] == 2 and bool(r["n_below_seeds"]) and r["mean"] == pytest.approx(3.0)
    assert not bool(row(s, group="pos=none", step=100, layer="layer_2", metric="hidden/kurtosis")["n_below_seeds"])
    c = row(pd.read_csv(res["out"] / "contrasts.csv"), step=100, layer="layer_2", metric="hidden/kurtosis")
    assert c["test"] == "paired t" and c["n_pairs"] == 2 and bool(c["n_below_seeds"])
    assert c["p_value"] == pytest.approx(stats.ttest_rel([2.0, 4.0], [1.0, 1.5]).pvalue, rel=1e-5)  # 6 digits in the CSV


def test_bounded_interval_stays_in_range_logit_for_few_seeds():
    x = [0.79, 0.21, 0.21]
    low, high, method = bounded_interval(x, 0.0, 1.0)
    z = np.log(np.array(x) / (1 - np.array(x)))
    h = stats.t.ppf(0.975, 2) * z.std(ddof=1) / math.sqrt(3)
    assert method == "logit t, 95%"
    assert low == pytest.approx(1 / (1 + math.exp(-(z.mean() - h)))) and high == pytest.approx(1 / (1 + math.exp(-(z.mean() + h))))
    assert 0 < low < high < 1  # the t interval of these values is 0.40 ± 0.83: below 0 and above 1
    lo2, hi2, m2 = bounded_interval([0.3, 0.35, 0.42], -1.0, 1.0)
    zf = np.arctanh([0.3, 0.35, 0.42])
    hf = stats.t.ppf(0.975, 2) * zf.std(ddof=1) / math.sqrt(3)
    assert m2 == "Fisher-z t, 95%" and lo2 == pytest.approx(math.tanh(zf.mean() - hf))


def test_bounded_interval_bootstraps_from_five_seeds():
    x = [0.1, 0.9, 0.15, 0.2, 0.12]
    low, high, method = bounded_interval(x, 0.0, 1.0)
    assert method == "bootstrap percentile, 95%" and min(x) <= low < np.mean(x) < high <= max(x)


def test_study_uses_bounded_intervals_for_shares(tmp_path):
    plant_study(tmp_path)
    s = pd.read_csv(study.run([str(tmp_path)], plots=False)["out"] / "study.csv")
    r = row(s, group="pos=learned", step=100, layer="layer_2", metric="hidden/argmax_share")  # 0.2, 0.4, 0.6
    assert r["ci"] == "logit t, 95%" and 0 < r["ci_low"] < 0.4 < r["ci_high"] < 1
    assert row(s, group="pos=learned", step=100, layer="layer_2", metric="hidden/kurtosis")["ci"] == "Student t, 95%"
    assert row(s, group="pos=learned", step=0, layer="layer_2", metric="hidden/kurtosis")["ci"] == "constant across seeds"


def test_the_design_is_read_from_the_cells_resolved_config(tmp_path):
    """Cells made since study_design exists carry it in config.yaml: primary family, contrast and margins."""
    from tests.study_fixtures import plant_cell

    design = {"study_design": {"contrasts": ["pos=learned,none"], "primary": ["hidden/kurtosis@layer_2"],
                               "equivalence_margin": {"hidden/kurtosis": 5.0}}}
    for pos, finals in (("learned", {1: 2.0, 2: 4.0, 3: 9.0}), ("none", {1: 1.0, 2: 1.5, 3: 2.0})):
        for seed, k in finals.items():
            plant_cell(tmp_path, {"pos": pos, "seed": seed}, {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0},
                                                             100: {"kurtosis": k, "share": 0.2, "ppl": 9.0}},
                       extra_config=design)
    res = study.run([str(tmp_path)], plots=False)  # no --contrast: the design's
    assert res["design"]["source"] == "the cells' resolved config"
    c = pd.read_csv(res["out"] / "contrasts.csv")
    r = row(c, step=100, layer="layer_2", metric="hidden/kurtosis")
    assert r["family"] == "primary" and r["margin"] == 5.0 and (c["family"] == "primary").sum() == 1
