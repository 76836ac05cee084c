"""IsoScore and IsoScore* of every layer for every transform (Rudman et al. 2022; Rudman & Eickhoff 2023).

* **IsoScore** of the covariance Σ of *all* non-special evaluation tokens (streamed in float64 by the sentence
  pass, ``FittedTransforms.source``).  Every transform is affine, x̂ = (x − μ)W, so the transformed covariance is
  WᵀΣW (``isoscore.transformed_covariance``): no second pass.
* **IsoScore*** as the authors' ``I-STAR/analysis.py``: the sample (the anisotropy tokens, one per sentence) has its
  covariance C shrunk toward C0 of all tokens, (1 − ζ)C + ζC0 with ζ = ``isotropy.zeta`` (0.75, theirs); ζ = 0 is
  the sample's IsoScore.

Both in [0, 1]: 1 = every direction carries the same variance, 0 = all variance on one line.
"""

from __future__ import annotations

import torch

from outlierlab.metrics.isoscore import covariance, isoscore_from_covariance, isoscore_star, transformed_covariance
from outlierlab.metrics.transforms import clip_mask
from outlierlab.evaluation.analyses.anisotropy import reservoir, transform_lines
from outlierlab.evaluation.registry import AnalysisResult, EvalContext
from outlierlab.configuration.analysis_settings import IsotropySettings
from outlierlab.evaluation.sentence_pass import sentence_stats
from outlierlab.reports.evaluation_report import plot_layers
from outlierlab.utils.tables import md_table

#: asked of the shared pass's fit (outlierlab.evaluation.sentence_pass.PASS_NEEDS): Σ of every layer, and every
#: transform's map (WᵀΣW)
SENTENCE_PASS = frozenset({"covariance", "fitted_maps"})

COLUMNS = ["layer", "transform", "isoscore", "isoscore_star", "zeta", "dims", "n_tokens", "n_star_points"]


def transformed_layer_covariance(st, name: str, layer: int, cov: torch.Tensor) -> torch.Tensor:
    """WᵀΣW of ``name`` at ``layer`` for Σ = ``cov`` ``[1, d, d]`` float64: Σ for none, Σ with the clipped rows and
    columns zeroed for clip (no d³ products: they dominated at d = 8192), the product for a fitted map."""
    if name == "none":
        return cov
    if name == "clip":
        keep = (~clip_mask(st.transforms.clip_dims, st.num_layers, st.dim)[layer]).to(cov)
        return cov * keep[:, None] * keep[None, :]
    # the fitted map W of this layer alone: [L, d, d] float64 copies are 40 GiB each for a 70B model
    return transformed_covariance(cov, st.transforms.fitted[name].W[layer:layer + 1].to(cov.device, torch.float64))


def consumers(ctx: EvalContext) -> list:
    """IsoScore*'s point cloud: the anisotropy reservoir (shared with anisotropy when both run)."""
    return [reservoir(ctx)]


def run(ctx: EvalContext) -> AnalysisResult:
    s = ctx.settings(IsotropySettings)
    st = sentence_stats(ctx)
    sample_acc = ctx.consumers[0].result()
    source = st.transforms.source
    if source is None or source.cov is None:
        raise ValueError("isotropy needs the streamed covariance of the sentence pass (select it in analyses=[...])")
    n_star = 2 * (sample_acc.n_kept // 2)  # the anisotropy tokens
    tfs = {t: st.transforms.get(t, st.dim) for t in ctx.transforms}
    iso, star, dims = {t: [] for t in tfs}, {t: [] for t in tfs}, {}
    # the d x d float64 algebra runs on the encoder's GPU when it has one (eigvalsh of an 8192² matrix is minutes on
    # a CPU core), else on the CPU
    dev = torch.device(getattr(ctx.encoder, "device", "cpu"))
    dev = dev if dev.type == "cuda" else torch.device("cpu")
    for layer in range(st.num_layers):  # one layer's d x d float64 matrices at a time (Σ and W may be on disk)
        cov = source.cov[layer:layer + 1].to(dev, torch.float64)
        sample = torch.cat(sample_acc.pair_vectors(layer), 1).to(torch.float64)  # [1, 2P, d]
        for t, tf in tfs.items():
            dims[t] = st.transforms.out_dim(t, st.dim)
            c0 = transformed_layer_covariance(st, t, layer, cov)
            iso[t].append(float(isoscore_from_covariance(c0)[0]))
            c = covariance(tf.select([layer])(sample)).to(dev)
            star[t].append(float(isoscore_star(c, c0, s.zeta)[0]))
    rows = [{"layer": layer, "transform": t, "isoscore": iso[t][layer], "isoscore_star": star[t][layer],
             "zeta": s.zeta, "dims": dims[t], "n_tokens": source.n, "n_star_points": n_star}
            for t in tfs for layer in range(st.num_layers)]
    fig = plot_layers(ctx.out_dir / "isotropy.png", iso, "IsoScore", "IsoScore of all evaluation tokens "
                      "(Rudman et al. 2022): 1 = isotropic, 0 = a line", hline=None) if ctx.plots else None
    md = ["## Isotropy: IsoScore and IsoScore* (Rudman et al. 2022; Rudman & Eickhoff 2023)",
          f"IsoScore of the float64 covariance of all {source.n} non-special evaluation tokens (after each transform: "
          "WᵀΣW), in [0, 1]: 1 = every direction of the space carries the same variance, 0 = all of it on one line "
          "— unlike the mean cosine (anisotropy), it does not move when the mean is shifted. "
          f"IsoScore* (column `isoscore_star`): the {n_star} anisotropy tokens' covariance shrunk toward "
          f"that covariance with ζ = {s.zeta:g} (the authors' analysis). Formula and code: "
          "`outlierlab.metrics.isoscore`, matching github.com/bcbi-edu/p_eickhoff_isoscore.",
          *transform_lines(st, ctx.transforms),
          md_table(["layer", *(f"{t}: IsoScore" for t in ctx.transforms), *(f"{t}: IsoScore*" for t in ctx.transforms)],
                   [[layer, *(iso[t][layer] for t in ctx.transforms), *(star[t][layer] for t in ctx.transforms)]
                    for layer in range(st.num_layers)]),
          "![IsoScore per layer](isotropy.png)"]
    summary = {"mean_isoscore": {t: sum(v) / len(v) for t, v in iso.items()},
               "mean_isoscore_star": {t: sum(v) / len(v) for t, v in star.items()}, "zeta": s.zeta}
    return AnalysisResult("isotropy", rows, "\n\n".join(md), [fig], summary)
