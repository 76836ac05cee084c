"""The study aggregate: no scipy precision warning (values equal up to rounding are one value), intervals inside
what a quantity can take at n = 2 (a share in [0, 1], a difference of two shares in [-1, 1]), one name per quantity,
and the contrasts on the console."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from outlierlab.studies.seed_statistics import CONSTANT, contrast, is_constant, summarize
from outlierlab.studies import aggregate as study
from tests.study_fixtures import plant_cell, row


def _rounded(x: float) -> float:
    return float(np.nextafter(x, 1.0))  # the same number, one float rounding apart


def test_values_equal_up_to_rounding_are_constant_and_raise_no_precision_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's "Precision loss ... catastrophic cancellation" was the first output
        # Welch, one group the same in every run: the other group's one-sample t against that value
        c = contrast({1: 0.3, 2: 0.3, 3: 0.3}, {4: 0.1, 5: 0.2, 6: 0.25})
        from scipy import stats

        assert c.test == "Welch t" and c.p_value == pytest.approx(stats.ttest_1samp([0.1, 0.2, 0.25], 0.3).pvalue)
        assert c.ci_low < c.diff < c.ci_high
        # paired differences that differ only by rounding: constant, no test
        a, b = {1: 0.3, 2: 0.3, 3: _rounded(0.3)}, {1: 0.0, 2: 0.0, 3: 0.0}
        d = contrast(a, b)
        assert np.isnan(d.p_value) and d.note == CONSTANT
        s = summarize([0.07666, 0.07666, _rounded(0.07666)])
        assert s.note == CONSTANT and np.isnan(s.ci_low)
    assert is_constant([0.0, 0.0]) and not is_constant([0.3, 0.31])


def _two_seed_study(root):
    # a share far apart in the two seeds of each group: at n = 2, t_{0.975,1} = 12.7 times the spread
    shares = {("learned", 1): 0.9, ("learned", 2): 0.1, ("none", 1): 0.05, ("none", 2): 0.6}
    for (pos, seed), share in shares.items():
        plant_cell(root, {"pos": pos, "seed": seed}, {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 900.0},
                                                      100: {"kurtosis": 2.0 + seed, "share": share, "ppl": 300.0}})
    return root


def test_intervals_stay_inside_what_the_quantity_can_take_at_two_seeds(tmp_path):
    res = study.run([str(_two_seed_study(tmp_path / "s"))], contrasts=["pos=learned,none"], plots=False)
    summary = pd.read_csv(res["out"] / "study.csv")
    shares = summary[summary["metric"] == "hidden/argmax_share"].dropna(subset=["ci_low"])
    assert len(shares) and (shares["ci_low"] >= 0).all() and (shares["ci_high"] <= 1).all()
    c = pd.read_csv(res["out"] / "contrasts.csv")
    r = row(c, step=100, layer="layer_2", metric="hidden/argmax_share")
    assert (r["ci_low"], r["ci_high"]) == (-1.0, 1.0)  # the t interval was about [-8.4, 8.8]
    assert "CI clipped at the range of the difference [-1, 1]" in r["note"]
    # an unbounded quantity keeps its t interval
    k = row(c, step=100, layer="layer_2", metric="hidden/kurtosis")
    assert "clipped" not in str(k["note"])


def test_the_console_shows_each_contrast_s_tests(tmp_path, capsys):
    root = _two_seed_study(tmp_path / "s")
    assert study.main([str(root), "--contrast", "pos=learned,none", "--no-plots"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("contrast pos: learned - none: ") and "primary" in line for line in out)
    assert any(line.startswith("  hidden/argmax_share@max_layer step 100: diff ") and "p_holm" in line for line in out)
    assert out[-1].startswith("wrote ")


def test_the_monitor_s_anisotropy_has_one_name_in_old_cells_too(tmp_path):
    """Cells that wrote the 1,000-pair estimate twice (anisotropy = token_pair_cosine) and older ones whose
    anisotropy was the 16-pair one beside a 1,000-pair token_pair_cosine: read as anisotropy (and
    anisotropy_one_per_sentence), never as two names for one number."""
    root = tmp_path / "s"
    for pos, older in (("learned", False), ("none", True)):
        for seed in (1, 2, 3):
            cell = plant_cell(root, {"pos": pos, "seed": seed}, {100: {"kurtosis": 2.0, "share": 0.3, "ppl": 9.0}})
            pairs, sixteen = 0.1 * seed + (pos == "learned") * (0.2 + 0.01 * seed ** 2), 0.05 * seed
            with open(cell / "monitor" / "hidden_states.csv", "a") as f:
                f.write(f"100,layer_2,anisotropy,,{sixteen if older else pairs}\n"
                        f"100,layer_2,token_pair_cosine,,{pairs}\n")
    res = study.run([str(root)], contrasts=["pos=learned,none"], plots=False,
                    primary=["hidden/token_pair_cosine@layer_2"])  # a design written with the old name
    summary = pd.read_csv(res["out"] / "study.csv")
    assert not summary["metric"].str.contains("token_pair_cosine").any()
    assert row(summary, group="pos=none", step=100, layer="layer_2", metric="hidden/anisotropy")["mean"] == \
        pytest.approx(0.2)
    assert row(summary, group="pos=none", step=100, layer="layer_2",
               metric="hidden/anisotropy_one_per_sentence")["mean"] == pytest.approx(0.1)
    assert "hidden/anisotropy_one_per_sentence" not in set(summary[summary["group"] == "pos=learned"]["metric"])
    c = pd.read_csv(res["out"] / "contrasts.csv")
    assert row(c, family="primary")["metric"] == "hidden/anisotropy"
