"""The normalisation layers the ``model.norm`` switch chooses between.

* ``layernorm`` — LayerNorm with a gain and a bias per dim (Ba et al. 2016), RoBERTa's choice and the
  parameters whose 3σ dims Kovaleva et al. (2021) and Puccetti et al. (2022) track;
* ``layernorm_noaffine`` — the same normalisation without gain and bias, so there is no per-dim
  parameter that can grow an outlier (He et al. 2024 still find outlier features with gain-free norms);
* ``rmsnorm`` — RMSNorm (Zhang & Sennrich 2019): ``y = x / sqrt(mean(x²) + eps) * g``, no centring,
  no bias.

All are torch's own modules (``nn.LayerNorm``, ``nn.RMSNorm``), so the LayerNorm monitor reads
``weight``/``bias`` the same way for each (``bias`` is ``None`` for RMSNorm, both are ``None`` for
the no-affine LayerNorm).
"""

from __future__ import annotations

from torch import nn

NORM_KINDS = ("layernorm", "layernorm_noaffine", "rmsnorm")

#: The module types :func:`make_norm` returns; for ``isinstance`` checks (initialisation, monitors).
NORM_TYPES = (nn.LayerNorm, nn.RMSNorm)


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """A normalisation layer of ``kind`` (see ``NORM_KINDS``) over the last ``dim`` features.

    Raises
    ------
    ValueError
        ``kind`` is not one of ``NORM_KINDS``.
    """
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
