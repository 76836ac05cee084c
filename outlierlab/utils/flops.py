"""Training FLOPs per token and model-FLOPs utilisation (MFU) of our encoder, as the GPU benchmark reports them.

Per trained token, forward + backward (Kaplan et al. 2020; the PaLM paper's MFU, Chowdhery et al. 2022, App. B)::

    F = 6 · N_body  +  6 · N_head · f  +  12 · L · T · d

* ``N_body`` = L · (4 d² + 2 d · d_ff): attention (q, k, v, output) and FFN matrices (lookups, biases and norms are
  not matmuls);
* ``N_head`` = d² + d · V: the LM head's dense layer and tied decoder, applied to the fraction ``f`` of tokens the
  head projects (the masked fraction for the masked LM, 1 for the causal LM);
* ``12 · L · T · d``: attention scores and the weighted sum of values at sequence length T.

fvcore and torch's FlopCounterMode count modules that ran and cannot see inside a fused attention kernel.
"""

from __future__ import annotations

from typing import Any

__all__ = ["body_matmul_params", "head_matmul_params", "flops_per_token", "mfu", "peak_bf16_flops", "PEAK_BF16"]

#: Dense bf16 tensor-core peaks, FLOP/s, from the vendors' data sheets (without sparsity).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


def body_matmul_params(config: Any) -> int:
    """L · (4 d² + 2 d · d_ff): the encoder layers' weight matrices (``config``: an EncoderConfig)."""
    d, ff, layers = int(config.hidden_size), int(config.intermediate_size), int(config.num_layers)
    return layers * (4 * d * d + 2 * d * ff)


def head_matmul_params(config: Any) -> int:
    """d² + d · V: the LM head's dense layer and decoder."""
    d = int(config.hidden_size)
    return d * d + d * int(config.vocab_size)


def flops_per_token(config: Any, seq_len: int, predicted_fraction: float) -> float:
    """Training FLOPs per token (module docstring) at sequence length ``seq_len``, the head projecting
    ``predicted_fraction`` of the tokens."""
    if not 0.0 <= predicted_fraction <= 1.0:
        raise ValueError(f"predicted_fraction must be in [0, 1], got {predicted_fraction}")
    attention = 12 * int(config.num_layers) * int(seq_len) * int(config.hidden_size)
    return 6 * body_matmul_params(config) + 6 * head_matmul_params(config) * predicted_fraction + attention


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops: float) -> float:
    """Model-FLOPs utilisation: achieved model FLOP/s over the device's peak."""
    return tokens_per_s * flops_per_tok / peak_flops


def peak_bf16_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device named like ``torch.cuda.get_device_name()`` ("NVIDIA H200"), or None."""
    name = device_name.upper()
    for key, value in PEAK_BF16.items():
        if key in name:
            return value
    return None
