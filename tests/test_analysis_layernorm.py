"""LayerNorm 3σ outliers and divergence (Kovaleva et al. 2021; Puccetti et al. 2022)."""

import csv
import io
import math

import pytest
import torch
from torch import nn

from outlierlab.metrics.layernorm import (LAYERNORM_ROW_FIELDS, flagged_from_rows, layernorm_divergence, layernorm_stats,
                                sigma_outlier_dims, sigma_outlier_mask)

D = 64


def _noise(d: int, seed: int, scale: float) -> torch.Tensor:
    """Deterministic 'Gaussian' noise: normal quantiles in random order, so no entry exceeds ~2.4σ."""
    q = torch.special.ndtri((torch.arange(d, dtype=torch.float64) + 0.5) / d)
    q = (q - q.mean()) / q.std(correction=0)
    return scale * q[torch.randperm(d, generator=torch.Generator().manual_seed(seed))]


def _planted(s: float = 0.02):
    """Gain = 1 + noise with dim 10 at +6σ; bias = noise with dim 40 at −5σ (σ = noise std s)."""
    gain = 1.0 + _noise(D, 0, s)
    bias = _noise(D, 1, s)
    gain[10] = 1.0 + 6 * s
    bias[40] = -5 * s
    return gain, bias


def test_planted_gain_and_bias_flagged_exactly():
    gain, bias = _planted()
    assert sigma_outlier_dims(gain) == [10]
    assert sigma_outlier_dims(bias) == [40]
    # the planted value inflates σ: check its z-score really is above 3 but well below 6
    z = (gain - gain.mean()).abs() / gain.std(correction=0)
    assert 3.0 < z[10] < 6.0 and z[torch.arange(D) != 10].max() < 3.0


def test_moderate_value_not_flagged_and_untouched_ln_flags_none():
    gain = 1.0 + _noise(D, 0, 0.02)
    gain[10] = 1.0 + 2.5 * 0.02  # inside 3σ: must not be flagged
    assert sigma_outlier_dims(gain) == []
    assert sigma_outlier_dims(1.0 + _noise(D, 3, 1e-4)) == []
    assert sigma_outlier_dims(torch.ones(D)) == []  # σ = 0 at init
    assert sigma_outlier_dims(torch.zeros(D)) == []


def test_single_value_can_never_pass_3_sigma_when_d_is_10():
    # z of one value among d is at most sqrt(d - 1) = 3 for d = 10 (strict > 3 never holds)
    v = torch.zeros(10)
    v[0] = 1e6
    assert sigma_outlier_dims(v) == []
    v = torch.zeros(12)
    v[0] = 1e6
    assert sigma_outlier_dims(v) == [0]


def test_batched_rows_are_judged_separately():
    gain, bias = _planted()
    mask = sigma_outlier_mask(torch.stack([gain, bias, torch.ones(D)]))
    assert mask.shape == (3, D)
    assert mask[0].nonzero().flatten().tolist() == [10]
    assert mask[1].nonzero().flatten().tolist() == [40]
    assert not mask[2].any()
    assert sigma_outlier_dims(torch.stack([gain, bias])) == [[10], [40]]


def test_divergence_hand_values():
    w, b = torch.tensor([1.0, 2.0, 0.5]), torch.tensor([0.0, -3.0, 1.0])
    out = layernorm_divergence(w, b, torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.0, 0.0, 0.5]))
    assert out["gain_div"].tolist() == [0.0, 1.0, -0.5]
    assert out["bias_div"].tolist() == [0.0, -3.0, 0.5]
    assert float(out["max_abs_gain_div"]) == 1.0 and int(out["argmax_abs_gain_div"]) == 1
    assert float(out["max_abs_bias_div"]) == 3.0 and int(out["argmax_abs_bias_div"]) == 1
    # default init: gain 1, bias 0
    out = layernorm_divergence(w, b)
    assert out["gain_div"].tolist() == [0.0, 1.0, -0.5] and float(out["max_abs_bias_div"]) == 3.0


def test_layernorm_stats_rows_and_csv_roundtrip():
    gain, bias = _planted()
    named = {"enc.0.ln": (gain, bias), "enc.1.ln": (torch.ones(D), torch.zeros(D)), "nobias": (gain, None)}
    initial = {"enc.0.ln": (torch.ones(D), torch.zeros(D))}
    rows = layernorm_stats(named, initial, k=3.0)
    assert [r["name"] for r in rows] == ["enc.0.ln", "enc.1.ln", "nobias"]
    r0, r1, r2 = rows
    assert (r0["n_gain_outliers"], r0["gain_outlier_dims"]) == (1, "10")
    assert (r0["n_bias_outliers"], r0["bias_outlier_dims"]) == (1, "40")
    assert float(r0["gain_outlier_values"]) == pytest.approx(1.12, rel=1e-5)
    gain_z = (gain - gain.mean()) / gain.std(correction=0)
    top = [int(x) for x in r0["top_gain_dims"].split(";")]
    assert len(top) == 5 and top[0] == 10 and top == gain_z.abs().topk(5).indices.tolist()
    assert float(r0["top_gain_z"].split(";")[0]) == pytest.approx(float(gain_z[10]), rel=1e-3)
    assert float(r0["top_bias_z"].split(";")[0]) < -3.0  # signed: the bias outlier is negative
    assert r0["max_abs_gain_div"] == pytest.approx(0.12) and r0["argmax_abs_gain_div"] == 10
    assert r0["max_abs_bias_div"] == pytest.approx(0.10) and r0["argmax_abs_bias_div"] == 40
    assert (r1["n_gain_outliers"], r1["n_bias_outliers"], r1["max_abs_gain_div"]) == (0, 0, 0.0)
    assert r1["top_gain_dims"] == ""  # constant LN: no z-scores
    assert r2["n_bias_outliers"] == 0 and math.isnan(r2["max_abs_bias_div"]) and r2["gain_outlier_dims"] == "10"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, LAYERNORM_ROW_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    back = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert flagged_from_rows(back, "gain") == {"enc.0.ln": [10], "enc.1.ln": [], "nobias": [10]}
    assert flagged_from_rows(back, "bias") == {"enc.0.ln": [40], "enc.1.ln": [], "nobias": []}


def test_layernorm_tensors_copy_every_norm_with_none_where_absent():
    from outlierlab.models.layernorms import layernorm_tensors

    lns = {"a": nn.LayerNorm(4), "b": nn.LayerNorm(4, bias=False), "c": nn.LayerNorm(4, elementwise_affine=False),
           "d": nn.RMSNorm(4)}
    with torch.no_grad():
        lns["a"].weight[2] = 5.0
    params = layernorm_tensors(lns)
    assert list(params) == ["a", "b", "c", "d"]
    assert params["a"][0].tolist() == [1.0, 1.0, 5.0, 1.0] and params["b"][1] is None
    assert params["c"] == (None, None) and params["d"][1] is None
    with torch.no_grad():
        lns["a"].weight[2] = 7.0
    assert params["a"][0][2] == 5.0  # a copy, not a view of the live parameter
