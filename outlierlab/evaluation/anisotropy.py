"""Anisotropy of every layer before/after clip and whiten (Ethayarajh 2019; Luo et al. 2021 §4.1, Fig. 6).

Paper protocol (outlierlab.analysis.similarity.AnisotropyAccumulator): one random token (non-special, non-pad) of each
of ``anisotropy.n_sentences`` sentences (default 2000, a seeded uniform reservoir when there are more), the
sentences shuffled and paired two by two → 1000 pairs of tokens from different sentences (never a token
with itself); anisotropy = mean cosine of the pairs.  The same pairs are used for every transform.
"""

from __future__ import annotations

from outlierlab.evaluation.registry import AnalysisResult, EvalContext, register
from outlierlab.reports.evaluation_report import md_table, plot_layers
from outlierlab.evaluation.streaming import sentence_stats


def transform_lines(st, transforms) -> list[str]:
    """How clip/whiten were obtained (one Markdown list), for every report section that uses them."""
    return ["\n".join(f"- **{t}**: {st.transforms.info[t]}" for t in transforms if t in st.transforms.info)]


@register("anisotropy")
def run(ctx: EvalContext) -> AnalysisResult:
    st = sentence_stats(ctx)
    acc = st.anisotropy_acc
    n_pairs = acc.n_kept // 2
    values = {t: st.anisotropy(t).tolist() for t in ctx.transforms}
    rows = [{"layer": layer, "transform": t, "anisotropy": v, "n_pairs": n_pairs, "n_sentences": acc.n_seen}
            for t, vals in values.items() for layer, v in enumerate(vals)]
    fig = plot_layers(ctx.out_dir / "anisotropy.png", values, "mean cosine of random token pairs",
                      f"anisotropy, {n_pairs} cross-sentence pairs (Luo et al. Fig. 6)", hline=0.0)
    md = ["## Anisotropy (Ethayarajh 2019; Luo et al. 2021 §4.1)",
          f"Mean cosine of {n_pairs} pairs of tokens from different sentences: one random non-special token of "
          f"each of {acc.n_kept} sentences (seed {st.settings['seed']}; sampled from {acc.n_seen} sentences), "
          "sentences paired two by two; the same pairs for every transform. 0 = isotropic, 1 = one direction.",
          *transform_lines(st, ctx.transforms),
          md_table(["layer", *ctx.transforms], [[layer, *(values[t][layer] for t in ctx.transforms)]
                                                for layer in range(st.num_layers)]),
          "![anisotropy per layer](anisotropy.png)"]
    summary = {"n_pairs": n_pairs, "mean_over_layers": {t: sum(v) / len(v) for t, v in values.items()},
               "transforms": dict(st.transforms.info)}
    return AnalysisResult("anisotropy", rows, "\n\n".join(md), [fig], summary)
