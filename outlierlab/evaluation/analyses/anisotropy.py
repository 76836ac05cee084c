"""Anisotropy of every layer for every transform (Ethayarajh 2019; Luo et al. 2021 §4.1, Fig. 6), and how much of it
each dimension causes (rogue dimensions, Timkey & van Schijndel 2021).

Paper protocol (``similarity.AnisotropyAccumulator``): one random valid token of each of ``anisotropy.n_sentences``
sentences (default 2000, a seeded reservoir when there are more), shuffled and paired → 1000 pairs from different
sentences; anisotropy = their mean cosine.  The same pairs for every transform.  On them ``rogue_dims.rogue_summary``:
each dim's CC_i (Σ_i CC_i = anisotropy), the top dims and their share, the top-k share (``anisotropy.rogue_k``, default
1/3/5) and r²/Spearman of pair cosines without the top k.  The whole CC vector goes to ``anisotropy_contributions.csv``
(layer, transform, dim, cc, share).
"""

from __future__ import annotations

from outlierlab.metrics.rogue_dims import MIN_Z, RogueSummary, rogue_summary
from outlierlab.evaluation.registry import AnalysisResult, EvalContext
from outlierlab.configuration.analysis_settings import AnisotropySettings
from outlierlab.evaluation.sentence_pass import AnisotropyReservoir, sentence_stats
from outlierlab.reports.evaluation_report import plot_layers, share_k
from outlierlab.utils.tables import md_table

#: asked of the shared pass's fit (outlierlab.evaluation.sentence_pass.PASS_NEEDS): every transform's map, applied
#: to the raw reservoir afterwards
SENTENCE_PASS = frozenset({"fitted_maps"})

#: Transforms whose coordinate i is not neuron i: their "dims" are directions of the fitted map.
MIXING = ("whiten", "abtt")


def transform_lines(st, transforms) -> list[str]:
    """How clip and the fitted transforms were obtained (one Markdown list), for every report section that uses them."""
    return ["\n".join(f"- **{t}**: {st.transforms.info[t]}" for t in transforms if t in st.transforms.info)]


def reservoir(ctx: EvalContext) -> AnisotropyReservoir:
    """The anisotropy reservoir of ``anisotropy.n_sentences`` sentences, seeded by the run: one subscriber shared by
    every analysis that reads it (anisotropy, isotropy, self-similarity)."""
    return AnisotropyReservoir(ctx.settings(AnisotropySettings).n_sentences, ctx.seed)


def consumers(ctx: EvalContext) -> list:
    return [reservoir(ctx)]


def run(ctx: EvalContext) -> AnalysisResult:
    s = ctx.settings(AnisotropySettings)
    st = sentence_stats(ctx)
    pairs = ctx.consumers[0]
    acc = pairs.result()
    n_pairs = acc.n_kept // 2
    rows, side, values, rogue = [], [], {}, {}
    for t in ctx.transforms:  # one layer's pairs (and their float64 copies) in memory at a time
        r = RogueSummary.stack([rogue_summary(*pairs.pairs(st.transforms, t, layer), s.rogue_k)
                                for layer in range(st.num_layers)])
        rogue[t] = r
        values[t] = r.anisotropy.tolist()
        for layer in range(st.num_layers):
            total = float(r.cc[layer].sum())
            first = next(iter(r.share.values()))
            ok = total != 0 and float(first[layer]) == float(first[layer])  # a share is defined (rogue_summary)
            top = r.order[layer, : s.rogue_list].tolist()
            row = {"layer": layer, "transform": t, "anisotropy": values[t][layer], "n_pairs": n_pairs,
                   # lists as every table writes them: ";"-separated (outliers' outlier_dims, ablation's dims)
                   "n_sentences": acc.n_seen, "rogue_dims": ";".join(map(str, top)),
                   "rogue_cc": ";".join(f"{float(r.cc[layer, d]):.5g}" for d in top),
                   "rogue_share": ";".join(f"{float(r.cc[layer, d]) / total:.4g}" if ok else "nan" for d in top)}
            row.update({f"top{k}_share": float(r.share[k][layer]) for k in r.share})
            row.update({f"r2_without_top{k}": float(r.r2[k][layer]) for k in r.r2})
            row.update({f"spearman_without_top{k}": float(r.spearman[k][layer]) for k in r.spearman})
            rows.append(row)
            side += [{"layer": layer, "transform": t, "dim": d, "cc": float(c), "share": float(c) / total if ok
                      else float("nan")} for d, c in enumerate(r.cc[layer].tolist())]
    fig = plot_layers(ctx.out_dir / "anisotropy.png", values, "mean cosine of random token pairs",
                      f"anisotropy, {n_pairs} cross-sentence pairs (Luo et al. Fig. 6)",
                      hline=0.0) if ctx.plots else None
    k_mid = share_k(rogue[ctx.transforms[0]].share)  # the k of the report's geometry table too
    shares = {t: rogue[t].share[k_mid].tolist() for t in ctx.transforms}
    fig2 = plot_layers(ctx.out_dir / "anisotropy_rogue_share.png", shares, f"share of the top {k_mid} dims",
                       "rogue dimensions: share of the anisotropy (Timkey & van Schijndel 2021)",
                       hline=0.0) if ctx.plots else None
    md = ["## Anisotropy (Ethayarajh 2019; Luo et al. 2021 §4.1)",
          f"Mean cosine of {n_pairs} pairs of tokens from different sentences: one random non-special token of "
          f"each of {acc.n_kept} sentences (seed {st.settings['seed']}; sampled from {acc.n_seen} sentences), "
          "sentences paired two by two; the same pairs for every transform. 0 = isotropic, 1 = one direction.",
          *transform_lines(st, ctx.transforms),
          md_table(["layer", *ctx.transforms], [[layer, *(values[t][layer] for t in ctx.transforms)]
                                                for layer in range(st.num_layers)]),
          "![anisotropy per layer](anisotropy.png)",
          "### Rogue dimensions (Timkey & van Schijndel 2021)",
          "Each dim's contribution to the mean pair cosine, CC_i = mean over the pairs of x_i·y_i/(‖x‖‖y‖), sums "
          "to the anisotropy exactly. A share is given only where the anisotropy is at least "
          f"{MIN_Z:g} standard errors from 0 (else –: a share of noise). "
          f"Below: the dim of largest CC_i and the share of the top {k_mid} dims "
          f"(CSV: top {s.rogue_list} dims with CC_i and share, the shares of the top "
          f"{'/'.join(map(str, rogue[ctx.transforms[0]].share))}, and r² / Spearman between the pair cosines with "
          "every dim and without the top k — how much those dims decide the similarity *ranking*; every CC_i in "
          "`anisotropy_contributions.csv`). "
          + ("After " + " and ".join(t for t in ctx.transforms if t in MIXING) + " a \"dim\" is a direction of the "
             "fitted map, not a neuron." if any(t in MIXING for t in ctx.transforms) else ""),
          md_table(["layer", *(f"{t}: top dim" for t in ctx.transforms), *(f"{t}: top-{k_mid} share" for t in ctx.transforms)],
                   [[layer, *(int(rogue[t].order[layer, 0]) for t in ctx.transforms),
                     *(shares[t][layer] for t in ctx.transforms)] for layer in range(st.num_layers)]),
          "![share of the anisotropy held by the top dims](anisotropy_rogue_share.png)"]
    summary = {"n_pairs": n_pairs, "mean_over_layers": {t: sum(v) / len(v) for t, v in values.items()},
               f"top{k_mid}_share": shares, "transforms": dict(st.transforms.info),
               "contributions_csv": "anisotropy_contributions.csv"}
    return AnalysisResult("anisotropy", rows, "\n\n".join(md), [fig, fig2], summary,
                          {"anisotropy_contributions": (side, ["layer", "transform", "dim", "cc", "share"])})
