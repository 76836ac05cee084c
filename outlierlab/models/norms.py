"""The normalisation layers the ``model.norm`` switch chooses between.

* ``layernorm`` — gain and bias per dim (Ba et al. 2016), RoBERTa's, whose 3σ dims Kovaleva et al. (2021) and
  Puccetti et al. (2022) track;
* ``layernorm_noaffine`` — no per-dim parameter to grow an outlier (He et al. 2024 still find outlier features);
* ``rmsnorm`` — RMSNorm (Zhang & Sennrich 2019): ``y = x / sqrt(mean(x²) + eps) * g``, no centring, no bias.

torch's own modules, so the monitor reads ``weight``/``bias`` alike (``None`` where absent).
"""

from __future__ import annotations

from torch import nn

NORM_KINDS = ("layernorm", "layernorm_noaffine", "rmsnorm")

#: The module types :func:`make_norm` returns; for ``isinstance`` checks (initialisation, monitors).
NORM_TYPES = (nn.LayerNorm, nn.RMSNorm)


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """A normalisation layer of ``kind`` (``NORM_KINDS``, else ValueError) over the last ``dim`` features."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if kind == "layernorm_noaffine":
        return nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown model.norm {kind!r}; valid: {', '.join(NORM_KINDS)}")


def reset_norm(module: nn.Module) -> None:
    """Standard initialisation: unit gain, zero bias (where the module has them)."""
    if getattr(module, "weight", None) is not None:
        nn.init.ones_(module.weight)
    if getattr(module, "bias", None) is not None:
        nn.init.zeros_(module.bias)
