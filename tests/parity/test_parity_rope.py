"""Jonasson 2025's rotary quantities against the frequencies their authors publish: RoPE's θ_i (Su et al.; Meta's
``models/llama3/model.py::precompute_freqs_cis``), Llama 3.1's scaling (meta-llama/llama-models
``models/llama3/model.py::apply_scaling``), GPT-NeoX's partial rotary (EleutherAI/gpt-neox
``megatron/model/transformer.py``), and Jonasson's partial-cycle count (arXiv:2503.01832 §4; no code published)."""

import math

import pytest
import torch
from reference_rope import apply_scaling, cycles, neox_rotary_dim, precompute_freqs

from outlierlab.metrics.qk_magnitudes import RotarySpec, magnitude_outliers
from outlierlab.models.qk_recorder import rotary_specs

pytestmark = pytest.mark.parity


def _llama(head_dim=64, **rope):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=2 * head_dim, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim,
                      max_position_embeddings=131_072, rope_parameters=rope or None)
    return LlamaForCausalLM(cfg).eval()


def test_unscaled_frequencies_and_cycles_equal_the_published_formula():
    """precompute_freqs_cis' freqs (float32, as Meta computes them) and θ·T/2π."""
    spec = RotarySpec.from_base(64, 64, 500_000.0, 8192)
    ref = precompute_freqs(64, 500_000.0)
    assert torch.allclose(torch.tensor(spec.inv_freq, dtype=torch.float64), ref.double(), rtol=1e-6)
    assert [spec.cycles(i) for i in range(32)] == pytest.approx([cycles(t, 8192) for t in spec.inv_freq], rel=1e-12)


def test_llama31_frequencies_read_from_the_model_equal_metas_apply_scaling():
    """rope_type llama3, factor 8: the θ_i the analysis reports are Meta's scaled frequencies."""
    model = _llama(rope_type="llama3", rope_theta=500_000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
    spec = rotary_specs(model, 1, 64, 1.0)[0]
    ref = apply_scaling(precompute_freqs(64, 500_000.0))
    assert torch.allclose(torch.tensor(spec.inv_freq, dtype=torch.float64), ref.double(), rtol=1e-6)
    bound = next(i for i in range(32) if cycles(float(ref[i]), 131_072) < 1.0)
    assert spec.first_partial_pair() == bound


def test_partial_rotary_dims_equal_gpt_neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    model = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=64, hidden_size=128, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=32, rotary_pct=0.25,
                                             max_position_embeddings=2048)).eval()
    spec = rotary_specs(model, 1, 64, 1.0)[0]
    assert spec.rotary_dim == neox_rotary_dim(64, 0.25) == 16
    assert torch.allclose(torch.tensor(spec.inv_freq, dtype=torch.float64), precompute_freqs(16, 10_000.0).double(), rtol=1e-6)


@pytest.mark.parametrize("n,flagged", [(19, False), (21, True), (64, True)])
def test_a_rotary_pair_is_detectable_from_21_dims_per_head(n, flagged):
    """Two equal outliers among n dims reach z = √((n − 2)/2): 3 exactly at n = 20, where the strict rule z > 3
    flags it or not by float rounding alone; from n = 21 it always does (docs/fidelity.md)."""
    v = torch.zeros(n, dtype=torch.float64)
    v[:2] = 25.0
    mask, z = magnitude_outliers(v, 3.0)
    assert float(z[0]) == pytest.approx(math.sqrt((n - 2) / 2)) and bool(mask[0]) is flagged
    v20 = torch.zeros(20, dtype=torch.float64)
    v20[:2] = 1.0
    assert float(magnitude_outliers(v20, 3.0)[1][0]) == pytest.approx(3.0, abs=1e-12)
