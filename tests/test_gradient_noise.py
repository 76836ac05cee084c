"""The simple noise scale (McCandlish et al. 2018) from batch gradients: a hand-computed case and a planted one."""

from __future__ import annotations

import math

import pytest
import torch

from outlierlab.metrics.gradient_noise import NoiseScale


def test_hand_computed_three_gradients():
    ns = NoiseScale(batch_size=4)
    for g in ([1.0, 0.0], [3.0, 0.0], [2.0, 3.0]):
        ns.update(torch.tensor(g))
    r = ns.result()
    # mean (2, 1): |mean|^2 = 5; deviations (-1,-1), (1,-1), (0,2): squared norms 2 + 2 + 4 = 8 over K-1 = 2 -> 4
    assert r["mean_grad_sq"] == pytest.approx(5.0)
    assert r["trace_cov_batch"] == pytest.approx(4.0)
    assert r["grad_sq"] == pytest.approx(5.0 - 4.0 / 3)
    assert r["b_simple"] == pytest.approx(4 * 4.0 / (5.0 - 4.0 / 3))


def test_planted_signal_and_noise_give_the_planted_noise_scale():
    """g_i = G + noise, |G|^2 = 1, tr(Sigma_B) = 100 * 0.05 = 5 at B = 8: B_simple = 8 * 5 / 1 = 40."""
    gen = torch.Generator().manual_seed(0)
    signal = torch.full((100,), 0.1)
    ns, pure = NoiseScale(batch_size=8), NoiseScale(batch_size=8)
    for _ in range(4000):
        noise = torch.randn(100, generator=gen) * math.sqrt(0.05)
        ns.update(signal + noise)
        pure.update(noise)
    r = ns.result()
    assert r["trace_cov_batch"] == pytest.approx(5.0, rel=0.03)
    assert r["grad_sq"] == pytest.approx(1.0, rel=0.05)
    assert r["b_simple"] == pytest.approx(40.0, rel=0.07)
    assert pure.result()["b_simple"] > 400  # no signal: a noise scale far above any batch (or inf)


def test_one_gradient_is_refused():
    ns = NoiseScale(batch_size=4)
    ns.update(torch.ones(3))
    with pytest.raises(ValueError, match="at least 2 batch gradients"):
        ns.result()
