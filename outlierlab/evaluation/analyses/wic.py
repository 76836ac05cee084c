"""Word-in-Context by cosine threshold, every layer, before/after clip and whiten (Luo et al. 2021 §4.2, Table 1).

Target vector = mean of the tokens overlapping the target's character span (end exclusive).  Per layer the cosine of the
two targets predicts "same sense" above a threshold, 0.1 … 0.9 (``wic_thresholds.threshold_sweep``).  The paper's sweep
picks the best (layer, threshold) on the split itself (``wic.split``, default ``train``): an upper bound.  Beside it the
honest protocol (``wic_thresholds.choose_then_report``): choices on ``wic.split`` applied unchanged to
``wic.report_split`` (SuperGLUE: ``validation``; WordNet set: ``test``) — ``report_*`` columns and a second report
table.

Sources (``wic.source``): ``wordnet`` (shipped, offline default; ``data/eval/NOTICE.md``); ``superglue`` (Pilehvar &
Camacho-Collados 2019, ``aps/super_glue``/``wic`` via ``datasets``; test unlabelled, so ``validation``);
``wic.files=[...]`` (jsonl/csv/tsv: sentence1, sentence2, start1, end1, start2, end2, label; optional ``split``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from outlierlab.metrics.transforms import FITTED
from outlierlab.metrics.wic_thresholds import all_true_baseline, best_per_layer, best_threshold, choose_then_report, threshold_sweep
from outlierlab.evaluation.registry import AnalysisResult, EvalContext
from outlierlab.reports.evaluation_report import plot_layers
from outlierlab.utils.tables import md_table
from outlierlab.datamodules.pair_sets import load_wic_pairs
from outlierlab.evaluation.analyses.layer_rows import pair_cosines
from outlierlab.evaluation.analyses.wic_targets import TargetVectors, target_vectors  # noqa: F401 (re-exported)
from outlierlab.configuration.run_settings import EncoderSettings, TransformSettings
from outlierlab.configuration.analysis_settings import WicSettings
from outlierlab.metrics.transform_fit import FittedTransforms, WhitenSettings
from outlierlab.evaluation.sentence_pass import borrow_fitted_maps, fit_on_sentences, task_transforms

#: read from the shared pass (outlierlab.evaluation.sentence_pass.PASS_NEEDS): its fitted maps with fit_on=sentences
SENTENCE_PASS = fit_on_sentences


def load_pairs(s: WicSettings, split: str | None = None, capped: bool = True) -> tuple[list[dict], str]:
    """WiC pairs of ``split`` (None: ``wic.split`` or the source's default) and a description
    (``outlierlab.datamodules.pair_sets.load_wic_pairs``); ``capped``: keep only the first ``wic.max_pairs``."""
    return load_wic_pairs(s.source, split if split is not None else (s.split or None), s.files, s.hub_path,
                          s.hub_name, s.max_pairs if capped else None)


def target_cosines(ft: FittedTransforms, names, vecs: TargetVectors, keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """Cosine of the two target vectors of every kept pair after each transform, ``{name: [L, P] float64}``,
    one layer at a time (``outlierlab.evaluation.analyses.layer_rows.pair_cosines``)."""
    cos = pair_cosines(ft, names, vecs.num_layers, vecs.dim, lambda layer: vecs.layer(layer)[:, keep])
    return {t: c.to(torch.float64) for t, c in cos.items()}


@dataclass
class WicData:
    """What ``check`` loads before any encoding and ``run`` evaluates (``EvalContext.prepared``)."""

    pairs: list[dict]  # wic.split: the threshold sweep, and the choice of layer/threshold
    what: str
    report: tuple[list[dict], str] | None  # wic.report_split pairs (honest protocol), if it differs
    fit_pairs: list[dict] | None  # transform.fit_on=<split>: the pairs the whitener is fitted on


def _fit_transforms(ctx, data: WicData, t: TransformSettings, ft: FittedTransforms, n_layers: int,
                    dim: int) -> WhitenSettings | None:
    """Fit the selected fitted transforms (whiten, standardize, abtt, center) into ``ft``; with
    ``transform.fit_on=eval`` return the settings the target pass fits them with instead (after it)."""
    names = [n for n in ctx.transforms if n in FITTED]
    if not names:
        return None
    settings = WhitenSettings.from_settings(t)  # k, abtt_d and the degenerate-fit guard
    fit_on = t.fit_on
    if fit_on == "eval":  # fitted by the target pass itself
        return settings
    if fit_on == "sentences":
        borrow_fitted_maps(ctx, ft, names)
        return None
    fit_pairs = data.fit_pairs
    w = target_vectors(ctx.encoder, fit_pairs, settings, ctx.settings(EncoderSettings).batch_size,
                       progress=bool(ctx.root_cfg.progress), fit_names=names)[2]
    what = f"the non-special token vectors of the WiC {fit_on!r} split ({len(fit_pairs)} pairs)"
    ft.set_all(settings.fit_all(w, names, what), source=w)
    return None


def check(ctx: EvalContext) -> WicData:
    """Load the pairs before any encoding (a bad file or an offline hub name fails in seconds)."""
    s = ctx.settings(WicSettings)
    pairs, what = load_pairs(s)
    report = None
    if s.report_split:  # threshold chosen on wic.split, accuracy reported on this split (never used to choose)
        rpairs = load_pairs(s, split=str(s.report_split))
        if rpairs[0] != pairs:  # local files without a `split` column have one split only: sweep alone
            report = rpairs
    fit_on = ctx.settings(TransformSettings).fit_on
    fit_pairs = None
    if any(n in FITTED for n in ctx.transforms) and fit_on not in ("eval", "sentences"):
        fit_pairs = load_pairs(s, split=fit_on, capped=False)[0]
    return WicData(pairs, what, report, fit_pairs)


def run(ctx: EvalContext) -> AnalysisResult:
    data = ctx.prepared if isinstance(ctx.prepared, WicData) else check(ctx)
    s = ctx.settings(WicSettings)
    t = ctx.settings(TransformSettings)
    batch_size, progress = ctx.settings(EncoderSettings).batch_size, bool(ctx.root_cfg.progress)
    pairs, what = data.pairs, data.what
    enc = ctx.encoder
    n_layers, dim = enc.num_layers + 1, enc.hidden_size
    thresholds = torch.tensor(s.thresholds, dtype=torch.float64)
    ft = task_transforms(ctx)
    fitting = _fit_transforms(ctx, data, t, ft, n_layers, dim)
    notes: list[str] = []
    vecs, found, fitted = target_vectors(enc, pairs, fitting, batch_size, progress=progress, notes=notes,
                                         fit_names=ctx.transforms)
    if fitted is not None:  # refuses a fit on too few distinct vectors unless transform.allow_degenerate=true
        ft.set_all(WhitenSettings.from_settings(t).fit_all(
            fitted, ctx.transforms, "the non-special token vectors of the evaluated WiC sentences"), source=fitted)
    if not bool(found.all()):
        notes.append(f"{int((~found).sum())} pairs dropped: a target span mapped to no token")
    keep = found.nonzero().flatten()
    kept = [pairs[i] for i in keep.tolist()]
    labels = torch.tensor([p["label"] for p in kept])
    cosines = target_cosines(ft, ctx.transforms, vecs, keep)  # one layer of target vectors in memory at a time
    surface = sum((p["sentence1"][p["start1"]:p["end1"]] == p["sentence2"][p["start2"]:p["end2"]]) == p["label"]
                  for p in kept) / len(kept)
    all_true = all_true_baseline(labels)
    report = None
    if data.report is not None:
        rpairs, rwhat = data.report
        rvecs, rfound, _ = target_vectors(enc, rpairs, None, batch_size, progress=progress)
        rkeep = rfound.nonzero().flatten()
        rlabels = torch.tensor([rpairs[i]["label"] for i in rkeep.tolist()])
        report = (target_cosines(ft, ctx.transforms, rvecs, rkeep), rlabels, rwhat, str(s.report_split))
        rvecs.cleanup()
        if not bool(rfound.all()):
            notes.append(f"{int((~rfound).sum())} {report[3]} pairs dropped: a target span mapped to no token")
    vecs.cleanup()
    rows, best, curves, held = _rows(ctx.transforms, ft, cosines, labels, thresholds, report, n_layers, len(kept))
    fig = plot_layers(ctx.out_dir / "wic.png", curves, "best accuracy over thresholds",
                      f"WiC: {what}", hline=all_true) if ctx.plots else None
    md = ["## Word in Context (Luo et al. 2021 §4.2, Table 1)",
          f"Data: {what}; {len(kept)} pairs ({int(labels.sum())} same sense). Target = mean of the tokens "
          "overlapping the target's character span; cosine of the two targets > threshold ⇒ \"same sense\"; "
          f"thresholds {', '.join(f'{float(x):g}' for x in thresholds)}. The best layer/threshold is picked on "
          "this split itself (the paper's sweep on the training split: an upper bound).",
          "\n".join([*(f"- **{t}**: {ft.info[t]}" for t in ctx.transforms if t in ft.info),
                     *(f"- note: {n}" for n in notes)]),
          md_table(["transform", "best layer", "threshold", "accuracy %"],
                   [[t, best[t][0], f"{best[t][1]:g}", 100 * best[t][2]] for t in ctx.transforms]
                   + [["all-true baseline", "–", "–", 100 * all_true],
                      ["surface-form baseline", "–", "–", 100 * surface]], 1),
          "Surface-form baseline: \"same sense\" iff the two target strings are identical.",
          "![WiC accuracy per layer](wic.png)"]
    if held:
        r_all_true = all_true_baseline(report[1])
        md += [f"**Held-out (honest protocol):** layer and threshold chosen on {what} only, accuracy on "
               f"{report[2]} ({len(report[1])} pairs; its labels never enter the choice). CSV: `report_*` columns.",
               md_table(["transform", "layer (chosen)", "threshold (chosen)", "held-out accuracy %"],
                        [[t, h["best_layer"], f"{h['best_threshold']:g}", 100 * h["best_report_accuracy"]]
                         for t, h in held.items()] + [["all-true baseline", "–", "–", 100 * r_all_true]], 1)]
    summary = {"data": what, "n_pairs": len(kept), "all_true_baseline": all_true, "surface_form_baseline": surface,
               "best": {t: {"layer": b[0], "threshold": b[1], "accuracy": b[2]} for t, b in best.items()},
               "transforms": dict(ft.info), "notes": notes,
               **({"held_out": {t: {"split": report[3], "layer": h["best_layer"], "threshold": h["best_threshold"],
                                    "accuracy": h["best_report_accuracy"]} for t, h in held.items()}} if held else {})}
    return AnalysisResult("wic", rows, "\n\n".join(md), [fig], summary)


def _rows(transforms, ft: FittedTransforms, cosines: dict, labels: torch.Tensor, thresholds: torch.Tensor, report,
          n_layers: int, n_kept: int) -> tuple[list[dict], dict, dict, dict]:
    """Per transform and layer: accuracy at every threshold, the best threshold, mean cosines, and (with a report
    split) the held-out accuracy of the layer/threshold chosen on the evaluated split."""
    rows, best, curves, held = [], {}, {}, {}
    for t in transforms:
        cos = cosines[t]  # [L, P]
        acc = threshold_sweep(cos, labels, thresholds)  # [L, T]
        thr_l, best_l = best_per_layer(acc, thresholds)
        best[t] = best_threshold(acc, thresholds)
        curves[t] = best_l.tolist()
        if report is not None:  # same transform fit (on the choose split's data), applied to the report split
            held[t] = choose_then_report(cos, labels, report[0][t], report[1], thresholds)
        for layer in range(n_layers):
            row = {"layer": layer, "transform": t, **ft.columns(t)}  # fitted rows: what it was fitted on
            row.update({f"acc_{float(th):g}": float(acc[layer, i]) for i, th in enumerate(thresholds)})
            row.update({"best_threshold": float(thr_l[layer]), "best_accuracy": float(best_l[layer]),
                        "mean_cos_same": float(cos[layer, labels].mean()) if labels.any() else float("nan"),
                        "mean_cos_diff": float(cos[layer, ~labels].mean()) if (~labels).any() else float("nan"),
                        "n_pairs": n_kept})
            if t in held:
                row.update({"report_split": report[3], "report_threshold": float(held[t]["threshold"][layer]),
                            "report_accuracy": float(held[t]["report_accuracy"][layer]),
                            "report_n_pairs": len(report[1])})
            rows.append(row)
    return rows, best, curves, held
