"""The MFU arithmetic of outlierlab.utils.flops on hand-computed shapes."""

from types import SimpleNamespace

import pytest

from outlierlab.utils.flops import body_matmul_params, flops_per_token, head_matmul_params, mfu, peak_bf16_flops

BASE = SimpleNamespace(hidden_size=768, num_layers=12, intermediate_size=3072, vocab_size=50265)


def test_roberta_base_by_hand():
    # 12 · (4 · 768² + 2 · 768 · 3072) = 12 · (2,359,296 + 4,718,592) = 84,934,656
    assert body_matmul_params(BASE) == 84_934_656
    # 768² + 768 · 50,265 = 589,824 + 38,603,520
    assert head_matmul_params(BASE) == 39_193_344
    # 6 · 84,934,656 + 6 · 39,193,344 · 0.15 + 12 · 12 · 512 · 768 = 509,607,936 + 35,274,009.6 + 56,623,104
    assert flops_per_token(BASE, 512, 0.15) == pytest.approx(601_505_049.6)
    # the causal head projects every token: 6 · 39,193,344 more than with f = 0
    assert flops_per_token(BASE, 128, 1.0) - flops_per_token(BASE, 128, 0.0) == pytest.approx(235_160_064)


def test_mfu_and_peaks():
    # 400k tokens/s at 601.5 MFLOP/token on a 989 TFLOP/s card: 24.3 %
    assert mfu(400_000, 601_505_049.6, 989e12) == pytest.approx(0.24328, abs=1e-5)
    assert peak_bf16_flops("NVIDIA H200") == 989e12 and peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_bf16_flops("cpu") is None
    with pytest.raises(ValueError, match=r"predicted_fraction must be in \[0, 1\]"):
        flops_per_token(BASE, 128, 1.5)
