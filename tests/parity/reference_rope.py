"""Rotary frequencies as their authors publish them, for the parity of Jonasson 2025's quantities: RoPE's
θ_i = base^(−2i/d) (Su et al. 2021; Meta's ``models/llama3/model.py::precompute_freqs_cis``), Llama 3.1's frequency
scaling (meta-llama/llama-models, ``models/llama3/model.py::apply_scaling``), GPT-NeoX's partial
rotary (EleutherAI/gpt-neox, ``megatron/model/transformer.py``: ``rotary_ndims = int(head_dim * rotary_pct)``), and Jonasson's
partial-cycle count θ_i·T/2π (arXiv:2503.01832 §4; no code published: written from the paper's definition)."""

import math

import torch


def precompute_freqs(dim: int, theta: float = 10000.0) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))


def apply_scaling(freqs: torch.Tensor) -> torch.Tensor:
    # Values obtained from grid search
    scale_factor = 8
    low_freq_factor = 1
    high_freq_factor = 4
    old_context_len = 8192  # original llama3 length

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * torch.pi / freqs
    new_freqs = torch.where(wavelen > low_freq_wavelen, freqs / scale_factor, freqs)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    return torch.where(
        (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen),
        (1 - smooth) * new_freqs / scale_factor + smooth * new_freqs,
        new_freqs,
    )


def neox_rotary_dim(head_dim: int, rotary_pct: float) -> int:
    return int(head_dim * rotary_pct)


def cycles(theta: float, context: int) -> float:
    """Turns of a pair rotated by θ over T positions: θ·T/2π; a partial cycle when < 1."""
    return theta * context / (2 * math.pi)
