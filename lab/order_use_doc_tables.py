"""The generated tables of docs/order_use.md (learned vs none, every position scheme, the objectives, the dimension
identity), from the committed order-use studies; each is a block ``<!-- generated: <name> -->`` of ``TABLES``
that ``lab.doc_tables`` renders.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import pandas as pd

from lab import doc_table_reads as reads
from lab.doc_table_reads import HOLM_FAMILIES, cells_of, shown

#: The order-use studies (docs/order_use.md): learned vs none, every scheme, the causal pair on english_large
ORDER_USE = "docs/order_use"


ORDER_USE_ROWS = [("val/loss", "model"), ("val/ppl", "model"), ("val/order_use", "model"), ("val/acc", "model"),
                  ("val/attn_local/layer_0", "model"), ("hidden/kurtosis", "max_layer"),
                  ("hidden/argmax_share", "max_layer"), ("hidden/abs_argmax_share", "max_layer"),
                  ("hidden/max_median", "max_layer"), ("hidden/anisotropy", "layer_4"), ("hidden/isoscore", "layer_4"),
                  ("hidden/inf_norm_ffn_output", "max_layer"), ("layernorm/n_outlier_dims", "model"),
                  ("layernorm/max_abs_gain_div", "max_layer"), ("hidden/sink_share_bos", "max_layer")]
#: The outlier measures of the schemes table (at the last step), each beside its BH q against pos=none.
SCHEME_OUTLIER_ROWS = [("hidden/kurtosis", "max_layer"), ("hidden/abs_argmax_share", "max_layer"),
                       ("hidden/max_median", "max_layer"), ("hidden/inf_norm_ffn_output", "max_layer"),
                       ("hidden/anisotropy", "layer_4"), ("hidden/isoscore", "layer_4"),
                       ("layernorm/n_outlier_dims", "model")]


def _learned_none_rows(study: str) -> str:
    """One row per ``ORDER_USE_ROWS`` entry of ``<study>/contrasts.csv`` at its last step: both means, the
    paired difference with its CI (and TOST where a margin was declared), the corrected p and the seeds' signs."""
    lines = ["| metric | layer | step | learned | none | diff [95% CI] | n pairs | p_holm / q_bh | seeds with the sign |",
             "|---|---|---|---|---|---|---|---|---|"]
    for metric, layer in ORDER_USE_ROWS:
        r = reads.contrast_at(study, None, metric, layer)
        if r is None:
            continue
        corrected = f"{r['p_holm']:.3g} (Holm, {r['family']})" if pd.notna(r["p_holm"]) else (
            f"{r['q_bh']:.3g} (BH, {r['family']})" if pd.notna(r["q_bh"]) else "not tested")
        tost = f"; TOST ±{r['margin']:g}: p {r['tost_p']:.3g}" if pd.notna(r.get("tost_p")) else ""
        lines.append(f"| {metric} | {layer} | {int(r['step'])} | {r['mean_a']:.4g} | {r['mean_b']:.4g} | {r['diff']:.3g} "
                     f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}]{tost} | "
                     f"{int(r['n_pairs']) if pd.notna(r['n_pairs']) else '–'} | {corrected} | "
                     f"{str(r['ordering']).split(';')[0]} |")
    return "\n".join(lines)


def order_use_objectives_large() -> str:
    """Haviv's 2 x 2 on ``data=english_large``: the objectives report of the two folders of cells."""
    from lab import objectives_report

    folders = [f"{ORDER_USE}/cells_large_mlm", f"{ORDER_USE}/cells_large"]
    return objectives_report.report([cells_of(f) for f in folders],
                                    source=" ".join(shown(cells_of(f)) for f in folders))[1]


def _scheme_rows(study: str = "study_schemes") -> tuple[pd.DataFrame, list[str]]:
    c = reads.read(f"{ORDER_USE}/{study}/contrasts.csv")
    return c, [name.split(":")[1].split("-")[0].strip() for name in dict.fromkeys(c["contrast"])]


def _scheme_at(study: str, scheme: str, metric: str, layer: str, step: int | None = None) -> pd.Series:
    return reads.contrast_at(f"{ORDER_USE}/{study}", f"pos: {scheme} - none", metric, layer, step)


def order_use_schemes(study: str = "study_schemes") -> str:
    """Every scheme against pos=none: val loss and order use with their Holm p, accuracy, and the order use at each
    earlier validation (the aggregator's contrasts ``pos: <scheme> - none``)."""
    c, schemes = _scheme_rows(study)
    steps = sorted(c.loc[c["metric"] == "val/order_use", "step"].unique())[:-1]
    lines = ["| pos | val loss | - none [95% CI], Holm p | order use | - none [95% CI], Holm p | acc | order use at "
             + ", ".join(f"{s + 1:,}" for s in steps) + " |", "|---|---|---|---|---|---|---|"]
    for scheme in schemes:
        loss, use, acc = (_scheme_at(study, scheme, m, "model") for m in ("val/loss", "val/order_use", "val/acc"))
        early = " / ".join(f"{_scheme_at(study, scheme, 'val/order_use', 'model', s)['mean_a']:.2f}" for s in steps)
        lines.append(f"| {scheme} | {loss['mean_a']:.3f} | {loss['diff']:.2f} [{loss['ci_low']:.2f}, "
                     f"{loss['ci_high']:.2f}], {loss['p_holm']:.2g} | {use['mean_a']:.2f} | {use['diff']:.2f} "
                     f"[{use['ci_low']:.2f}, {use['ci_high']:.2f}], {use['p_holm']:.2g} | {acc['mean_a']:.3f} | {early} |")
    ref = {m: _scheme_at(study, schemes[0], m, "model")["mean_b"] for m in ("val/loss", "val/order_use", "val/acc")}
    lines.append(f"| none | {ref['val/loss']:.3f} | | {ref['val/order_use']:.4f} | | {ref['val/acc']:.3f} | |")
    return "\n".join(lines)


def order_use_schemes_outliers(study: str = "study_schemes") -> str:
    """The outlier measures of every scheme at the last step, each with its BH q against pos=none (bold below 0.05)."""
    _, schemes = _scheme_rows(study)
    lines = ["| pos | " + " | ".join(f"{m.split('/')[1]} ({layer})" for m, layer in SCHEME_OUTLIER_ROWS) + " |",
             "|---|" + "---|" * len(SCHEME_OUTLIER_ROWS)]
    for scheme in schemes:
        cells = []
        for metric, layer in SCHEME_OUTLIER_ROWS:
            r = _scheme_at(study, scheme, metric, layer)
            confirmatory = r["family"] in HOLM_FAMILIES  # a confirmatory row: its Holm p; else its family's q
            value = r["p_holm"] if confirmatory else r["q_bh"]
            q = (f"Holm p {value:.2g}" if confirmatory else f"q {value:.2g}") if pd.notna(value) else "not tested"
            bold = pd.notna(value) and value < 0.05
            cells.append(f"**{r['mean_a']:.3g}** ({q})" if bold else f"{r['mean_a']:.3g} ({q})")
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    lines.append("| none | " + " | ".join(f"{_scheme_at(study, schemes[0], m, layer)['mean_b']:.3g}"
                                          for m, layer in SCHEME_OUTLIER_ROWS) + " |")
    return "\n".join(lines)


def order_use_objectives() -> str:
    """Haviv's 2 x 2 where the masked model uses its positions (docs/order_use.md): each group's mean at the last
    step of ``study_objectives/study.csv`` -- val loss and perplexity, order use with its 95 % interval (0 shown
    bare where every seed is 0 to four decimals), layer-4 anisotropy and the |x| argmax share of the most
    concentrated layer."""
    s = reads.read(f"{ORDER_USE}/study_objectives/study.csv")

    def at(group: str, metric: str, layer: str) -> pd.Series:
        sub = s[(s["group"] == group) & (s["metric"] == metric) & (s["layer"] == layer)]
        return sub.loc[sub["step"].idxmax()]

    lines = ["| objective | pos | val loss | val ppl | order use (nats) [95% CI] | anisotropy, layer 4 | "
             "abs argmax share, max layer |", "|---|---|---|---|---|---|---|"]
    for objective in ("mlm", "clm"):
        for pos in ("learned", "none"):
            g = f"objective={objective},pos={pos}"
            use, ppl = at(g, "val/order_use", "model"), at(g, "val/ppl", "model")["mean"]
            # a masked LM without positions: 0 by construction, shown without a meaningless interval
            zero = max(abs(use["ci_low"]), abs(use["ci_high"])) < 1e-3
            use_text = f"{use['mean']:.4f}" if zero else f"{use['mean']:.2f} [{use['ci_low']:.2f}, {use['ci_high']:.2f}]"
            loss, ppl_text = at(g, "val/loss", "model")["mean"], f"{ppl:.0f}" if ppl >= 100 else f"{ppl:.1f}"
            aniso = at(g, "hidden/anisotropy", "layer_4")["mean"]
            share = at(g, "hidden/abs_argmax_share", "max_layer")["mean"]
            lines.append(f"| {objective} | {pos} | {loss:.3f} | {ppl_text} | {use_text} | {aniso:.3f} | {share:.3f} |")
    return "\n".join(lines)


def order_use_dim_identity(folder: str = "dim_identity_large_4000") -> str:
    """Which dimension, since when (``outlierlab.studies.dim_identity``), every scheme on ``data=english_large`` at
    step 4,000 (5 seeds): per layer 1-4, the mean |x| argmax share, the median held fraction and the seeds whose
    layer ends on the previous layer's dimension."""
    from outlierlab.studies.dim_identity import summary

    s = summary(reads.read(f"{ORDER_USE}/{folder}/dim_identity.csv"))
    layers = [1, 2, 3, 4]
    lines = ["| objective, pos | " + " | ".join(f"layer {n}: share · held · as {n - 1}" for n in layers) + " |",
             "|---|" + "---|" * len(layers)]
    for (objective, pos), g in s.groupby(["objective", "pos"], sort=True):
        g = g.set_index("layer")
        lines.append(f"| {objective}, {pos} | " + " | ".join(f"{g.at[n, 'share']:.2f} · {g.at[n, 'held_fraction']:.2f} · "
                                                f"{g.at[n, 'as_previous']}/{g.at[n, 'seeds']}" for n in layers) + " |")
    return "\n".join(lines)


#: Every block of docs/order_use.md, by name: a table function, bound to the study it reads where several share one.
TABLES: dict[str, Callable[[], str]] = {
    # learned vs none: experiment=order_recipe (3 finished pairs at 6,000 steps; with the 2 learned cells the clock
    # cut, all 5 at step 5,000), and the causal and the masked pair on data=english_large (5 seeds, 6,000 steps)
    "order_use_study": partial(_learned_none_rows, f"{ORDER_USE}/study"),
    "order_use_study_5seeds": partial(_learned_none_rows, f"{ORDER_USE}/study_5seeds"),
    "order_use_large": partial(_learned_none_rows, f"{ORDER_USE}/study_large"),
    "order_use_large_mlm": partial(_learned_none_rows, f"{ORDER_USE}/study_large_mlm"),
    # every scheme: the small data set, the masked schemes on data=english_large, and those with seeds 4-5 at 4,000
    "order_use_schemes": order_use_schemes,
    "order_use_schemes_outliers": order_use_schemes_outliers,
    "order_use_schemes_large": partial(order_use_schemes, "study_schemes_large"),
    "order_use_schemes_large_outliers": partial(order_use_schemes_outliers, "study_schemes_large"),
    "order_use_schemes_large_5seeds": partial(order_use_schemes, "study_schemes_large_5seeds"),
    "order_use_schemes_large_5seeds_outliers": partial(order_use_schemes_outliers, "study_schemes_large_5seeds"),
    "order_use_objectives": order_use_objectives,
    "order_use_objectives_large": order_use_objectives_large,
    # which dimension: every scheme at step 4,000, and the causal and masked pairs (5 seeds, 6,000 steps)
    "order_use_dim_identity": order_use_dim_identity,
    "order_use_dim_identity_objectives": partial(order_use_dim_identity, "dim_identity_objectives_large"),
}
