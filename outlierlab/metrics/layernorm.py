"""LayerNorm weight outliers: the one LayerNorm-outlier rule, the 3σ criterion, divergence from initialisation.

Kovaleva et al. (2021), "BERT Busters: Outlier Dimensions that Disrupt Transformers", flag the dims of each
layer's *output* LayerNorm whose gain (scaling factor) **and** bias both lie outside mean ± 3σ of that
LayerNorm's weights; Puccetti et al. (2022), "Outlier Dimensions that Disrupt Transformers Are Driven by
Frequency", keep the 3σ rule and call a dim an outlier of the *model* when it is flagged in more than 3 of
BERT-base's 12 layers.  Both track how far gain/bias move from their initial values (gain₀ = 1, bias₀ = 0).

``outlierlab.metrics.layernorm_rule.LayerNormRule`` + ``outlierlab.metrics.layernorm_rule.layernorm_outliers`` are THE rule: the training monitor, ``evaluate.py``'s
outliers analysis, the ablation, the frequency and the attention-sink analyses all call them with the
``ln_rule`` config group (``configs/ln_rule/``), so they flag identical dims on the same weights.
``layernorm_stats`` is descriptive (gain and bias judged separately, z-scores, divergence) and
flags nothing at the model level.

LayerNorm names are the canonical keys of ``outlierlab.models.layernorms.model_layernorms``: ``embeddings``,
``layer.{i}.attention_output``, ``layer.{i}.output`` (and ``head`` for the MLM head's LayerNorm, only
when asked).  Every function here is pure (tensors in, tensors / plain Python out).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

__all__ = [
    "sigma_outlier_mask",
    "sigma_outlier_dims",
    "layernorm_divergence",
    "layernorm_stats",
    "flagged_from_rows",
    "LAYERNORM_ROW_FIELDS",
]


def sigma_outlier_mask(values: Tensor, k: float = 3.0) -> Tensor:
    r"""Boolean mask of entries lying outside mean ± k·σ along the last dimension.

    .. math:: \text{out}_i = |v_i - \bar v| > k\,\sigma,\qquad
              \bar v = \tfrac1d\sum_j v_j,\quad \sigma = \sqrt{\tfrac1d\sum_j (v_j-\bar v)^2}

    The 3σ rule of Kovaleva et al. (2021) and Puccetti et al. (2022).  σ is the *population* standard
    deviation (ddof = 0) over the ``d`` entries of one row, computed in float64.  The outlier itself
    enters μ and σ (as in the papers), so a single value among ``d`` can reach at most a z-score of
    ``sqrt(d - 1)``: for d ≤ 10 the 3σ rule can never fire.  A constant row (σ = 0) flags nothing.

    Parameters
    ----------
    values : Tensor[..., d]
        Any leading (batch/layer) dimensions; each row is judged on its own statistics.
    k : float
        Number of standard deviations.

    Returns
    -------
    Tensor[..., d] (bool)
    """
    if values.ndim == 0:
        raise ValueError("sigma_outlier_mask needs at least one dimension (the d dims of a row).")
    v = values.detach().to(torch.float64)
    mean = v.mean(-1, keepdim=True)
    std = v.std(-1, correction=0, keepdim=True)
    return (v - mean).abs() > k * std


def sigma_outlier_dims(values: Tensor, k: float = 3.0) -> list:
    """Dims outside mean ± k·σ (see ``sigma_outlier_mask``), sorted by |z| descending.

    Parameters
    ----------
    values : Tensor[d] or Tensor[R, d]
    k : float

    Returns
    -------
    list[int] for a 1-D input, list[list[int]] (one list per row) for a 2-D input.
    """
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

    (Puccetti et al. 2022 track how outlier gains grow away from init.)  If ``weight0``/``bias0`` are
    None the standard init (γ₀ = 1, β₀ = 0) is used.  Works on any leading dims ``[..., d]``.

    Returns
    -------
    dict with ``gain_div`` / ``bias_div`` (Tensor[..., d], float64), ``max_abs_gain_div`` /
    ``max_abs_bias_div`` (Tensor[...]) and ``argmax_abs_gain_div`` / ``argmax_abs_bias_div`` (Tensor[...]).
    Bias entries are omitted when ``bias`` is None (LayerNorm without bias).
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
    """One flat, CSV-friendly record per LayerNorm: 3σ outliers of gain and bias, divergence from init.

    The single function used by the training-time LayerNorm monitor and by ``evaluate.py``
    (Kovaleva et al. 2021; Puccetti et al. 2022).

    Parameters
    ----------
    named_layernorms : Mapping[str, (weight Tensor[d], bias Tensor[d] | None)]
        e.g. from ``outlierlab.models.layernorms.layernorm_tensors``.
    initial : same mapping at initialisation, or None
        If None, divergence is measured from the standard init (gain 1, bias 0); a name missing from
        ``initial`` also falls back to that.
    k : float
        σ multiplier of the outlier rule.
    top_k : int
        Length of the ``top_*_dims`` / ``top_*_z`` columns: the dims with the largest |z-score|
        whether or not they pass k·σ, to watch outliers *emerge* before they are flagged.

    Returns
    -------
    list[dict]
        Keys are ``LAYERNORM_ROW_FIELDS``; every value is a str, int or float, so the list can go
        straight to ``outlierlab.utils.tables.write_csv(path, rows, LAYERNORM_ROW_FIELDS)``.

        - ``*_outlier_dims``: every flagged dim, largest |z| first, ``";"``-joined (``"588;77"``;
          ``""`` if none); ``*_outlier_values``: their raw gain/bias values (``%.6g``).
        - ``top_*_dims`` / ``top_*_z``: top-|z| dims and their signed z-scores (``%.4g``).
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

