"""Macocco et al. 2025 against a port of their code (github.com/imacocco/llms_outlier_dimensions: ``src/evaluate.py``
``outlier_dims_quantile`` and the condition loop of ``run``; ``src/analysis.py`` ``lin_coeff``)."""

import math

import numpy as np
import pytest
import torch
from reference_macocco import ablation_modalities, lin_coeff as their_lin_coeff, outlier_dims_quantile, score

from outlierlab.metrics.frequent_token_logits import lin_coeff, macocco_outlier_dims
from outlierlab.evaluation.analyses.frequent_tokens import score_conditions

pytestmark = [pytest.mark.parity, pytest.mark.filterwarnings("ignore:One or more sample arguments is too small")]
V, D, N = 300, 256, 400  # N even: their median is the mean of the two middle values


def _model(seed=0):
    """Last-layer vectors with two outlier dims (5, 17), an unembedding matrix with one outlier column (40) and
    rows that favour frequent tokens, a Zipf corpus in which 20 tokens never occur, and next tokens."""
    g = np.random.default_rng(seed)
    reps = g.normal(0, 1, (N, D))
    reps[:, 5] += 12.0
    reps[:, 17] -= 9.0
    freq = np.round(5000 / np.arange(1, V + 1) ** 1.1).astype(np.int64)
    freq[g.choice(V, 20, replace=False)] = 0
    X_out = g.normal(0, 0.05, (V, D))
    X_out[:, 5] = 0.1 * np.log1p(freq) + g.normal(0, 0.02, V)
    X_out[:, 40] = g.normal(0, 3.0, V)
    next_token = g.choice(V, N, p=(freq + 1) / (freq + 1).sum())
    return reps, X_out, freq, next_token


def test_outlier_dim_rule_equals_theirs_on_vectors_and_on_the_unembedding():
    """outlier_dims_quantile(X, loc=0.5, glo=0.99) on the last layer and on the unembedding rows."""
    reps, X_out, *_ = _model()
    assert macocco_outlier_dims(torch.from_numpy(reps)) == outlier_dims_quantile(reps).tolist() == [5, 17]
    assert macocco_outlier_dims(torch.from_numpy(X_out)) == outlier_dims_quantile(X_out).tolist() == [40, 5]


def test_conditions_and_lin_coeff_equal_theirs():
    """run's only_/ablate_ ODs and out conditions (KL, entropy, surprisal, top-1) and lin_coeff per condition
    (slope, Spearman, n_tokens, accuracy) — their counts file lists the tokens the corpus counts."""
    reps, X_out, freq, next_token = _model(1)
    np.seterr(all="ignore")
    ods = outlier_dims_quantile(reps)
    mods = ablation_modalities(reps, X_out, ods, np.random.default_rng(0), n_random=0)
    theirs = score(reps, X_out, mods, next_token)
    counts_file = np.stack([np.nonzero(freq)[0], freq[freq > 0]], 1)
    sets = {"macocco": macocco_outlier_dims(torch.from_numpy(reps)),
            "unembedding": macocco_outlier_dims(torch.from_numpy(X_out))}
    rows = score_conditions(torch.from_numpy(reps), torch.from_numpy(next_token), torch.from_numpy(X_out), None, sets,
                            torch.from_numpy(freq), n_random=0, seed=0, min_count=1)
    by = {(r["rule"], r["condition"]): r for r in rows}
    pairs = {("model", "full"): "full_model", ("macocco", "only"): "only_ODs", ("macocco", "without"): "ablate_ODs",
             ("unembedding", "only"): "only_out", ("unembedding", "without"): "ablate_out"}
    for key, name in pairs.items():
        ours, t = by[key], theirs[name]
        for m in ("entropy", "surprisal") + (("kl_div",) if name != "full_model" else ()):
            assert ours[m if m != "kl_div" else "kl"] == pytest.approx(float(t[m].mean()), rel=1e-9, abs=1e-12), (name, m)
        slope, rho, n_tokens, acc = their_lin_coeff(t["top"], next_token, counts_file)
        assert ours["top1"] == pytest.approx(acc) and ours["n_tokens"] == n_tokens, name
        if ours["lin_status"] == "ok":
            assert ours["spearman"] == pytest.approx(rho, abs=1e-12) and ours["slope"] == pytest.approx(slope), name
        else:  # theirs: NaN (scipy) or 0 (their except); ours: NaN and why
            assert math.isnan(ours["spearman"]) and (rho == 0 or math.isnan(rho)), name
    status = {k: by[k]["lin_status"] for k in pairs}
    # the two outlier dims alone always predict the most frequent token: one token, nothing to correlate
    assert status == {**{k: "ok" for k in pairs}, ("macocco", "only"): "one token"}


def test_random_controls_avoid_both_sets_as_their_not_rd():
    """run: random dims drawn from not_rd = neither last-layer nor unembedding outliers (5 draws of |ODs|)."""
    reps, X_out, freq, next_token = _model(2)
    mods = ablation_modalities(reps, X_out, outlier_dims_quantile(reps), np.random.default_rng(0))
    excluded = set(outlier_dims_quantile(reps)) | set(outlier_dims_quantile(X_out))
    assert all(not set(mods[f"only_random{i}"]) & excluded for i in range(5))
    sets = {"macocco": macocco_outlier_dims(torch.from_numpy(reps)),
            "unembedding": macocco_outlier_dims(torch.from_numpy(X_out))}
    rows = score_conditions(torch.from_numpy(reps), torch.from_numpy(next_token), torch.from_numpy(X_out), None, sets,
                            torch.from_numpy(freq), n_random=5, seed=0, min_count=1)
    row = next(r for r in rows if (r["rule"], r["condition"]) == ("macocco", "random_only"))
    draws = [set(map(int, d.split(";"))) for d in row["dims"].split("|")]
    assert len(draws) == 5 and all(len(d) == len(sets["macocco"]) and not d & excluded for d in draws)


def test_where_their_fit_is_undefined_ours_says_so():
    """lin_coeff over one predicted token: their try/except would write 0 where the fit fails; scipy gives NaN
    for ρ here. Ours: NaN and a status."""
    freq = np.array([50, 20, 5, 0])
    preds = np.array([1, 1, 1, 1])
    counts_file = np.stack([np.nonzero(freq)[0], freq[freq > 0]], 1)
    with np.errstate(all="ignore"), pytest.warns(Warning):
        _, rho, n_tokens, _ = their_lin_coeff(preds, np.zeros(4, dtype=int), counts_file)
    ours = lin_coeff(torch.from_numpy(freq), torch.bincount(torch.from_numpy(preds), minlength=4))
    assert n_tokens == ours.n_tokens == 1 and ours.status == "one token"
    assert math.isnan(ours.spearman) and (rho == 0 or math.isnan(rho))
