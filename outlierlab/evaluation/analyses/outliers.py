"""Outlier dimensions of every layer (Luo, Kulmizev & Mao 2021 §2) and of the weights that feed them: the
position-embedding table (Luo §3, Figs. 3–4) and every LayerNorm (Kovaleva et al. 2021; Puccetti et al. 2022).

Activations: per layer the mean token vector (Figs. 1–2), the argmax/argmin shares of the top dims and the outlier dims
(``detect_outlier_dims``), for every transform (after whitening coordinates are principal directions, not neurons).
Weights: the mean position vector and its 3σ dims (learned absolute tables only, as the family declares them;
rotary/ALiBi/relative models have none, said so), and ``layernorm_stats`` of every norm, judged by the one rule (pre-LN:
both per-layer norms; bias-free norms on their gain).  An unregistered ``model_type`` gets one line saying how to add
it; the rest still runs.
"""

from __future__ import annotations

import torch
from torch import nn

from outlierlab.metrics.layernorm import LAYERNORM_ROW_FIELDS, layernorm_stats, sigma_outlier_dims
from outlierlab.metrics.layernorm_rule import layernorm_outliers
from outlierlab.evaluation.analyses.ln_rule import ln_rule
from outlierlab.models.families import UnknownFamilyError, family_of
from outlierlab.models.layernorms import layernorm_tensors, model_layernorms
from outlierlab.metrics.outlier_dims import detect_outlier_dims, position_row_stats
from outlierlab.metrics.position_shares import POSITION_COLUMNS
from outlierlab.evaluation.activation_pass import (ACTIVATION_COLUMNS, ActivationObserver, activation_columns,
                                                   activation_section, position_share_section)
from outlierlab.monitoring import monitor_plots
from outlierlab.evaluation.registry import AnalysisResult, EvalContext
from outlierlab.reports.evaluation_report import plot_vectors
from outlierlab.utils.tables import md_table
from outlierlab.configuration.analysis_settings import OutliersSettings
from outlierlab.evaluation.sentence_pass import OutlierCounts, sentence_stats

#: read from the shared pass (outlierlab.evaluation.sentence_pass.PASS_NEEDS): none of its statistics, only its
#: facts (sentences, their source); the counts and activations are this analysis' own consumers
SENTENCE_PASS = frozenset()

COLUMNS = ["layer", "transform", "n_tokens", "n_outlier_dims", "outlier_dims", "argmax_dim", "argmax_share",
           "argmin_dim", "argmin_share", "top_dims", "top_mean_values", "top_argmax_share", "top_argmin_share",
           "mean_norm"] + ACTIVATION_COLUMNS  # activation columns: raw vectors (transform none) only
POSITION_SUFFIX = "embeddings.position_embeddings.weight"


def position_table(model: nn.Module) -> tuple[str, torch.Tensor] | None:
    """``(name, rows actually used)`` of a learned absolute position table, or None: the family's ``position_weight``
    (GPT-2's ``wpe``), else an ``nn.Embedding`` named ``*embeddings.position_embeddings``. RoBERTa-style tables
    (``padding_idx`` set) drop rows ``0..padding_idx``, which positions never use."""
    if not hasattr(model, "named_layernorms"):
        try:
            return family_of(model).position_weight(model)
        except UnknownFamilyError:
            pass
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and f"{name}.weight".endswith(POSITION_SUFFIX):
            w = module.weight.detach().float().cpu()
            pad = module.padding_idx
            return f"{name}.weight", (w[pad + 1:] if pad is not None and pad >= 0 else w)
    return None


def position_outliers(model: nn.Module, k: float = 3.0, top_k: int = 5) -> dict | None:
    """Mean position vector (over the table's rows) and its dims outside mean ± kσ (Luo et al. Figs. 3–4)."""
    found = position_table(model)
    if found is None:
        return None
    name, table = found
    mean = table.to(torch.float64).mean(0)
    dims = sigma_outlier_dims(mean, k)
    return {"name": name, "rows": int(table.shape[0]), "mean": mean, "sigma_dims": dims,
            "sigma_values": [float(mean[i]) for i in dims], "top_abs_dims": mean.abs().topk(top_k).indices.tolist(),
            "table": table, "by_row": position_row_stats(table, k)}


def _position_rows_section(pos: dict, out, k: float, plots: bool, tables: dict) -> tuple[str, object]:
    """Luo et al. Figs. 3–4 row by row: per-row argmax/argmin dims and kσ dims; the ``position_rows`` table (into
    ``tables``) and a plot (None when ``plots`` is off)."""
    st = pos["by_row"]
    per_row = [{"row": r, "argmax_dim": int(st["argmax"][r]), "argmin_dim": int(st["argmin"][r]),
                "sigma_dims": ";".join(map(str, st["sigma_mask"][r].nonzero().flatten().tolist()))}
               for r in range(st["rows"])]
    tables["position_rows"] = (per_row, ["row", "argmax_dim", "argmin_dim", "sigma_dims"])
    if plots:
        img = monitor_plots.render(monitor_plots.position_rows_figure(pos["table"].numpy(), st, pos["name"]))
        monitor_plots.save_png(img, out / "position_rows.png")
    shares = ", ".join(f"{d} ({100 * float(st['sigma_row_share'][d]):.1f}%)" for d in st["sigma_dims"]) or "none"
    text = (f"Row by row ({st['rows']} rows; Luo et al. find dim 588 the argmax of 99.8% of RoBERTa-base's "
            f"position embeddings): dim {st['argmax_dim']} is the argmax of {100 * st['argmax_share']:.1f}% of the "
            f"rows, dim {st['argmin_dim']} the argmin of {100 * st['argmin_share']:.1f}%. Dims outside their row's "
            f"mean ± {k:g}σ in at least half the rows: {shares}. Per row: `position_rows.csv`.\n\n"
            "![position embeddings row by row](position_rows.png)")
    return text, out / "position_rows.png" if plots else None


def consumers(ctx: EvalContext) -> list:
    """The outlier counts after every transform of the run (the raw ones shared with clip's detection) and the
    activation metrics of the raw vectors along the forward."""
    n = ctx.encoder.num_layers + 1
    return [*(OutlierCounts(t, n) for t in dict.fromkeys(["none", *ctx.transforms])), ActivationObserver(ctx.encoder)]


def _rows(counts: dict, transforms, s: OutliersSettings) -> tuple[list[dict], dict[str, list[list[int]]]]:
    top_k, method, thr, k = s.top_k, s.method, s.threshold, s.k
    rows, detected = [], {}
    for t in transforms:
        acc = counts.get(t)
        if acc is None or acc.count == 0:
            continue
        dims = detect_outlier_dims(acc, method, thr, k)
        detected[t] = dims
        mean, smax, smin = acc.mean(), acc.argmax_share(), acc.argmin_share()
        for s in acc.summary(top_k):
            layer, top = s["layer"], s["top_dims"]
            rows.append({
                "layer": layer, "transform": t, "n_tokens": s["n_tokens"], "n_outlier_dims": len(dims[layer]),
                "outlier_dims": ";".join(map(str, dims[layer])),
                "argmax_dim": s["argmax_dim"], "argmax_share": s["argmax_share"],
                "argmin_dim": s["argmin_dim"], "argmin_share": s["argmin_share"],
                "top_dims": ";".join(map(str, top)),
                "top_mean_values": ";".join(f"{v:.4g}" for v in s["top_values"]),
                "top_argmax_share": ";".join(f"{float(smax[layer, i]):.4f}" for i in top),
                "top_argmin_share": ";".join(f"{float(smin[layer, i]):.4f}" for i in top),
                "mean_norm": float(mean[layer].norm()),
            })
    return rows, detected


def sentences_about(rows: list[dict], min_share: float = 0.25) -> list[str]:
    """'dim 588 holds the max of 99.8% of tokens at layer 3' for every layer/direction above ``min_share``."""
    out = []
    for r in rows:
        for what, key in (("max", "argmax"), ("min", "argmin")):
            if r[f"{key}_share"] >= min_share:
                out.append(f"dim {r[f'{key}_dim']} holds the {what} of {100 * r[f'{key}_share']:.1f}% of tokens "
                           f"at layer {r['layer']}")
    return out


def run(ctx: EvalContext) -> AnalysisResult:
    s = ctx.settings(OutliersSettings)
    st = sentence_stats(ctx)
    counts = {c.transform: c.result() for c in ctx.consumers if isinstance(c, OutlierCounts)}
    obs = next((c for c in ctx.consumers if isinstance(c, ActivationObserver)), None)
    rows, detected = _rows(counts, ctx.transforms, s)
    tables: dict = {}
    md, figures, summary = _token_section(ctx, st, counts, obs, s, rows, detected, tables)
    model = ctx.encoder.model
    try:
        family, family_note = family_of(model), ""
    except UnknownFamilyError as e:
        family, family_note = None, str(e)
    md += _position_section(ctx, model, family, s, detected, figures, summary, tables)
    md += _layernorm_section(ctx, model, family, family_note, summary, tables)
    summary["family"] = family.name if family is not None else None
    if family is not None and family.decoder:
        md.append("_Decoder: each token vector sees only its left context (causal attention); the same pooling "
                  "rules as for encoders (non-special, non-pad tokens) apply._")
    return AnalysisResult("outliers", rows, "\n\n".join(md), figures, summary, tables)


def _token_section(ctx, st, counts: dict, obs, s, rows: list[dict], detected: dict,
                   tables: dict) -> tuple[list[str], list, dict]:
    """Luo et al. §2 on the token vectors: dominant dims, the per-layer table, the average vectors, the
    activation metrics (added to the ``none`` rows) and the |x|-argmax share by position (``tables``)."""
    out, figures, md = ctx.out_dir, [], ["## Outlier dimensions (Luo et al. 2021 §2)"]
    thr = s.threshold
    n_tok = counts["none"].count
    md.append(f"{st.n_sentences} sentences ({st.settings.get('source', '')}), {n_tok} non-special tokens; "
              f"layer 0 = embedding output. Outlier rule: `{s.method}` "
              f"(share ≥ {thr:g} of tokens with their argmax/argmin on the dim; "
              "outlierlab.metrics.outlier_dims.detect_outlier_dims).")
    none_rows = [r for r in rows if r["transform"] == "none"]
    said = sentences_about(none_rows, thr)
    none_said = f"no dim holds the max or min of ≥ {100 * thr:g}% of tokens in any layer."
    md.append("**Dominant dimensions (raw vectors):** " + ("; ".join(said) + "." if said else none_said))
    acc_none = counts["none"]
    pooled = ({w: acc_none.pooled_share(w) for w in ("argmin", "argmax")}
              if acc_none.count and acc_none.num_layers > 1 else {})
    if pooled:
        md.append("**Pooled over all non-input layers (Luo et al. §2: dim 557 holds the minimum of 96.60% of all "
                  "token vectors of BERT-base's layers 1–12):** " + "; ".join(
                      f"dim {d} holds the {w[3:]} of {100 * v:.2f}%" for w, (d, v) in pooled.items()) + ".")
    tabrows = [[r["layer"], r["transform"], r["outlier_dims"] or "–", r["argmax_dim"], 100 * r["argmax_share"],
                r["argmin_dim"], 100 * r["argmin_share"], r["top_dims"].replace(";", ", ")] for r in rows]
    md.append(md_table(["layer", "transform", "outlier dims", "argmax dim", "argmax %", "argmin dim", "argmin %",
                        "top dims by |mean|"], tabrows, 1))
    if "whiten" in detected:
        md.append("_After whitening the coordinates are principal directions of the fitted covariance, not neurons._")
    if acc_none.count:
        mean = acc_none.mean()
        if ctx.plots:
            figures.append(plot_vectors(out / "outliers_mean_vectors.png", mean.tolist(),
                                        [f"layer {i}" for i in range(mean.shape[0])],
                                        [mean[i].abs().topk(3).indices.tolist() for i in range(mean.shape[0])],
                                        "average token vector per layer (Luo et al. Figs. 1–2)"))
        md.append("![average token vectors](outliers_mean_vectors.png)")
    summary = {"outlier_dims": detected, "dominant": said,
               "pooled": {w: {"dim": d, "share": v} for w, (d, v) in pooled.items()}}
    if obs is not None and acc_none.count:
        cols = activation_columns(obs)
        for r in rows:
            r.update(cols[r["layer"]] if r["transform"] == "none" else {c: "" for c in ACTIVATION_COLUMNS})
        md.append(activation_section(cols, obs.note))
        by_position = obs.by_position.rows()
        tables["outliers_by_position"] = (by_position, POSITION_COLUMNS)
        md.append(position_share_section(by_position))
        summary["kurtosis"] = [c["kurtosis"] for c in cols]
        summary["max_median"] = [c["max_median"] for c in cols]
    return md, figures, summary


def _position_section(ctx, model, family, s, detected: dict, figures: list, summary: dict, tables: dict) -> list[str]:
    """Luo et al. §3: the learned position table's mean vector and its σ dims (figures appended to ``figures``)."""
    out = ctx.out_dir
    pos = position_outliers(model, s.position_k)
    md = ["### Position embeddings (Luo et al. §3, Figs. 3–4)"]
    if pos is None:
        uses = family.positions if family is not None else "relative / rotary / ALiBi / sinusoidal / no positions"
        md.append(f"No position table: this model has no learned absolute position table ({uses}); nothing to "
                  "report.")
        return md
    vals = ", ".join(f"{d} ({v:+.3g})" for d, v in zip(pos["sigma_dims"], pos["sigma_values"]))
    md.append(f"`{pos['name']}`: mean over its {pos['rows']} used rows; dims outside mean ± "
              f"{s.position_k:g}σ: {vals or 'none'}. Largest |mean|: "
              f"{', '.join(map(str, pos['top_abs_dims']))}.")
    if ctx.plots:
        figures.append(plot_vectors(out / "position_mean_vector.png", [pos["mean"].tolist()], [pos["name"]],
                                    [pos["sigma_dims"]], "mean position vector (3σ dims marked)", ncols=1))
    md.append("![mean position vector](position_mean_vector.png)")
    text, fig = _position_rows_section(pos, out, s.position_k, ctx.plots, tables)
    md.append(text)
    figures.append(fig)
    act = {d for dims in detected.get("none", []) for d in dims}
    summary["position"] = {k: v for k, v in pos.items() if k not in ("mean", "table", "by_row")}
    summary["position"].update({k: pos["by_row"][k] for k in ("argmax_dim", "argmax_share", "argmin_dim",
                                                               "argmin_share", "sigma_dims")})
    if act:
        md.append(f"3σ position dims that are also activation outlier dims in some layer: "
                  f"{sorted(act & set(pos['sigma_dims'])) or 'none'}.")
    return md


def _layernorm_section(ctx, model, family, family_note: str, summary: dict, tables: dict) -> list[str]:
    """Kovaleva et al. 2021 / Puccetti et al. 2022: THE LayerNorm-outlier rule (configs/ln_rule, as the monitor
    and the ablation) on the model's norms; per-norm columns in ``layernorm.csv``."""
    rule = ln_rule(ctx)
    md = [f"### LayerNorm weights (Kovaleva et al. 2021; Puccetti et al. 2022: {rule.k:g}σ rule)"]
    if family is None:
        params = {}
        md.append(f"LayerNorms not judged: {family_note}.")
    else:
        norms = model_layernorms(model, include_head=True)
        params = layernorm_tensors(norms)
        names = {id(m): n for n, m in model.named_modules()}
        judged = [k for k in norms if rule.selects(k)]
        md.append(f"Model family: {family.describe()}. Norms judged by the rule ({len(judged)}): "
                  + ", ".join(f"`{names.get(id(norms[k]), k)}`" for k in judged[:4])
                  + (f", … (`{names.get(id(norms[judged[-1]]), judged[-1])}`)" if len(judged) > 4 else "")
                  + (". Pre-LN: both per-layer norms take the role of Kovaleva et al.'s output LayerNorm "
                     "(docs/fidelity.md)." if family.placement == "pre" else "."))
        summary["layernorms_judged"] = [names.get(id(norms[k]), k) for k in judged]
    ln = layernorm_stats({n: (w, b) for n, (w, b) in params.items() if w is not None}, k=rule.k)
    if ln:
        tables["layernorm"] = (ln, list(LAYERNORM_ROW_FIELDS))
        md.append(md_table(["LayerNorm", "gain 3σ dims", "bias 3σ dims"],
                           [[r["name"], r["gain_outlier_dims"].replace(";", ", ") or "–",
                             r["bias_outlier_dims"].replace(";", ", ") or "–"] for r in ln]))
    det = layernorm_outliers(params, rule)
    md.append(f"Outlier dims of the model: {det.describe()}. Per-LayerNorm columns (gain and bias judged "
              "separately, descriptive): `layernorm.csv`.")
    summary["layernorm_outlier_dims"] = det.dims
    return md
