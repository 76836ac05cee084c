"""LayerNorm weight outliers: the one LayerNorm-outlier rule, the 3σ criterion, divergence from initialisation.

Kovaleva et al. (2021), "BERT Busters: Outlier Dimensions that Disrupt Transformers", flag the dims of each layer's
*output* LayerNorm whose gain **and** bias both lie outside mean ± 3σ of that LayerNorm's weights; Puccetti et al.
(2022), "Outlier Dimensions that Disrupt Transformers Are Driven by Frequency", call a dim an outlier of the *model*
when it is flagged in more than 3 of BERT-base's 12 layers.  Both track how far gain/bias move from init (1, 0).

THE rule is ``outlierlab.metrics.layernorm_rule.layernorm_outliers``, built on ``sigma_outlier_mask`` here;
``layernorm_stats`` is descriptive and flags nothing at the model level.  Names are the keys of
``outlierlab.models.layernorms.model_layernorms``; every function here is pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

__all__ = ["sigma_outlier_mask", "sigma_outlier_dims", "layernorm_divergence", "layernorm_stats", "flagged_from_rows",
           "LAYERNORM_ROW_FIELDS"]


def sigma_outlier_mask(values: Tensor, k: float = 3.0) -> Tensor:
    r"""Boolean mask of entries outside mean ± k·σ along the last dimension of ``values`` [..., d].

    .. math:: \text{out}_i = |v_i - \bar v| > k\,\sigma,\qquad
              \bar v = \tfrac1d\sum_j v_j,\quad \sigma = \sqrt{\tfrac1d\sum_j (v_j-\bar v)^2}

    The 3σ rule of Kovaleva et al. (2021) and Puccetti et al. (2022): population σ (ddof 0) per row, in float64.  The
    outlier enters μ and σ (as in the papers), so one value among ``d`` reaches at most z = ``sqrt(d - 1)``: for d ≤ 10
    the rule never fires.  A constant row flags nothing.
    """
    if values.ndim == 0:
        raise ValueError("sigma_outlier_mask needs at least one dimension (the d dims of a row).")
    v = values.detach().to(torch.float64)
    mean = v.mean(-1, keepdim=True)
    std = v.std(-1, correction=0, keepdim=True)
    return (v - mean).abs() > k * std


def sigma_outlier_dims(values: Tensor, k: float = 3.0) -> list:
    """Dims outside mean ± k·σ (``sigma_outlier_mask``), sorted by |z| descending: a list for a [d] input, one list per
    row for [R, d]."""
    if values.ndim not in (1, 2):
        raise ValueError(f"sigma_outlier_dims expects [d] or [rows, d], got shape {tuple(values.shape)}.")
    rows = values.detach().to(torch.float64).reshape(-1, values.shape[-1])
    mask = sigma_outlier_mask(rows, k)
    dev = (rows - rows.mean(-1, keepdim=True)).abs()
    out = []
    for r in range(rows.shape[0]):
        idx = mask[r].nonzero().flatten()
        order = dev[r, idx].argsort(descending=True, stable=True)
        out.append(idx[order].tolist())
    return out[0] if values.ndim == 1 else out


def layernorm_divergence(weight: Tensor, bias: Tensor | None, weight0: Tensor | None = None,
                         bias0: Tensor | None = None) -> dict[str, Tensor]:
    r"""Per-dim divergence of a LayerNorm's gain and bias from their values at initialisation.

    .. math:: \Delta\gamma_i = \gamma_i - \gamma^{(0)}_i,\qquad \Delta\beta_i = \beta_i - \beta^{(0)}_i

    (Puccetti et al. 2022 track how outlier gains grow away from init.)  ``weight0``/``bias0`` None: γ₀ = 1, β₀ = 0.
    Returns ``gain_div``/``bias_div`` ([..., d] float64), ``max_abs_*_div`` and ``argmax_abs_*_div`` ([...]); no bias
    entries when ``bias`` is None.
    """
    w = weight.detach().to(torch.float64)
    w0 = torch.ones_like(w) if weight0 is None else weight0.detach().to(w)
    if w0.shape != w.shape:
        raise ValueError(f"weight {tuple(w.shape)} and initial weight {tuple(w0.shape)} differ in shape.")
    out: dict[str, Tensor] = {"gain_div": w - w0}
    if bias is not None:
        b = bias.detach().to(torch.float64)
        b0 = torch.zeros_like(b) if bias0 is None else bias0.detach().to(b)
        if b0.shape != b.shape:
            raise ValueError(f"bias {tuple(b.shape)} and initial bias {tuple(b0.shape)} differ in shape.")
        out["bias_div"] = b - b0
    for name in ("gain", "bias"):
        if f"{name}_div" in out:
            m, i = out[f"{name}_div"].abs().max(-1)
            out[f"max_abs_{name}_div"], out[f"argmax_abs_{name}_div"] = m, i
    return out


#: Columns of one :func:`layernorm_stats` row, in order (CSV header).
LAYERNORM_ROW_FIELDS = (
    "name", "dim", "k",
    "gain_mean", "gain_std", "n_gain_outliers", "gain_outlier_dims", "gain_outlier_values",
    "top_gain_dims", "top_gain_z",
    "bias_mean", "bias_std", "n_bias_outliers", "bias_outlier_dims", "bias_outlier_values",
    "top_bias_dims", "top_bias_z",
    "max_abs_gain_div", "argmax_abs_gain_div", "max_abs_bias_div", "argmax_abs_bias_div",
)


def _join(xs: Iterable, fmt: str = "{}") -> str:
    return ";".join(fmt.format(x) for x in xs)


def layernorm_stats(named_layernorms: Mapping[str, tuple[Tensor, Tensor | None]],
                    initial: Mapping[str, tuple[Tensor, Tensor | None]] | None = None,
                    k: float = 3.0, top_k: int = 5) -> list[dict]:
    """One flat, CSV-friendly record per LayerNorm (keys ``LAYERNORM_ROW_FIELDS``): 3σ outliers of gain and bias,
    divergence from init (Kovaleva et al. 2021; Puccetti et al. 2022); the training monitor's and ``evaluate.py``'s.

    ``named_layernorms``: name -> (weight [d], bias [d] or None), e.g. ``layernorm_tensors``.  ``initial``: the same at
    init; None, or a missing name, measures from gain 1, bias 0.  ``top_k``: length of the ``top_*_dims``/``top_*_z``
    columns, the largest-|z| dims whether flagged or not (to watch outliers emerge).

    - ``*_outlier_dims``: flagged dims, largest |z| first, ``";"``-joined (``""`` if none); ``*_outlier_values``: their
      raw values (``%.6g``).  ``top_*_z``: signed z-scores (``%.4g``).
    - ``max_abs_*_div`` / ``argmax_abs_*_div``: largest |value − initial value| and its dim.
    - A LayerNorm without bias gets NaN / ``""`` / 0 / −1 in the bias columns.

    ``flagged_from_rows`` turns rows back into ``{name: flagged dims}``.
    """
    rows = []
    for name, (weight, bias) in named_layernorms.items():
        w0, b0 = (initial or {}).get(name, (None, None))
        div = layernorm_divergence(weight, bias, w0, b0)
        row: dict = {"name": name, "dim": int(weight.shape[-1]), "k": float(k)}
        for part, vec in (("gain", weight), ("bias", bias)):
            if vec is None:
                row.update({f"{part}_mean": math.nan, f"{part}_std": math.nan, f"n_{part}_outliers": 0,
                            f"{part}_outlier_dims": "", f"{part}_outlier_values": "", f"top_{part}_dims": "",
                            f"top_{part}_z": "", f"max_abs_{part}_div": math.nan, f"argmax_abs_{part}_div": -1})
                continue
            v = vec.detach().to(torch.float64).flatten()
            mean, std = v.mean(), v.std(correction=0)
            z = (v - mean) / std if std > 0 else torch.zeros_like(v)
            top = z.abs().topk(min(top_k, v.numel())).indices.tolist() if std > 0 else []
            dims = sigma_outlier_dims(v, k)
            row.update({
                f"{part}_mean": float(mean),
                f"{part}_std": float(std),
                f"n_{part}_outliers": len(dims),
                f"{part}_outlier_dims": _join(dims),
                f"{part}_outlier_values": _join(v[dims].tolist(), "{:.6g}"),
                f"top_{part}_dims": _join(top),
                f"top_{part}_z": _join(z[top].tolist(), "{:.4g}"),
                f"max_abs_{part}_div": float(div[f"max_abs_{part}_div"]),
                f"argmax_abs_{part}_div": int(div[f"argmax_abs_{part}_div"]),
            })
        rows.append({f: row[f] for f in LAYERNORM_ROW_FIELDS})
    return rows


def flagged_from_rows(rows: Iterable[Mapping], which: str = "gain") -> dict[str, list[int]]:
    """LayerNorm name -> flagged dims, parsed from ``layernorm_stats`` rows (``which``: gain|bias)."""
    if which not in ("gain", "bias"):
        raise ValueError(f"which must be 'gain' or 'bias', got {which!r}.")
    col = f"{which}_outlier_dims"
    return {r["name"]: [int(x) for x in str(r[col]).split(";") if x != ""] for r in rows}

