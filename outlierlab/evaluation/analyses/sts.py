"""Semantic Textual Similarity, every layer, before/after clip and whiten (Luo et al. 2021 §4.3, Table 2; SentEval).

Sentence vector = mean of its valid token vectors (``SentenceVectors``); score = cosine; quality = Spearman's ρ
with the gold scores (``sts_scores.sts_spearman``).  Clip and whiten are affine, so transforming the pooled vector
equals pooling transformed tokens.

Aggregation as SentEval (Conneau & Kiela 2018): per data set every pair pooled (``subset`` = ``all``) and, with a
sub-set column (``sts.subset_field``, e.g. STS12-16's genres), ρ per sub-set and their unweighted mean (``subset`` =
``mean``, SentEval's headline); the ``dataset`` = ``mean`` rows average each data set's headline.
``sts.files=[a.csv,b.csv]`` gives one data set per file.  Each distinct text is encoded once.

No STS data can be shipped (licences): skipped with a note unless ``sts.datasets=[stsb,sickr,sts12,...]`` (hub, through
``datasets``; offline from its cache) or ``sts.files=[pairs.csv]`` (sentence1, sentence2, score;
.csv/.tsv/.json/.jsonl).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from outlierlab.metrics.sts_scores import sts_spearman
from outlierlab.metrics.postprocessing import FITTED, fit_size
from outlierlab.metrics.whitening import DegenerateWhiteningError
from outlierlab.datamodules.pair_sets import STS_HUB, StsPairs, load_sts_pairs
from outlierlab.evaluation.encoding import distinct_texts, encode_log_line
from outlierlab.utils.disk_room import check_room
from outlierlab.evaluation.analyses.layer_rows import LayerRows, pair_cosines
from outlierlab.evaluation.registry import AnalysisResult, EvalContext
from outlierlab.evaluation.sentence_stream import Consumer, LayerStream, StreamBatch
from outlierlab.configuration.run_settings import EncoderSettings, TransformSettings
from outlierlab.configuration.analysis_settings import StsSettings
from outlierlab.evaluation.sentence_pass import borrow_fitted_maps, fit_on_sentences, task_transforms
from outlierlab.metrics.transform_fit import FittedTransforms, WhitenSettings
from outlierlab.reports.evaluation_report import plot_layers
from outlierlab.utils.tables import md_table

WHITEN_COLUMNS = ["whiten_fit", "whiten_n", "whiten_distinct", "whiten_rank", "whiten_k", "whiten_degenerate"]
COLUMNS = ["layer", "transform", "dataset", "subset", "split", "spearman", "n_pairs", *WHITEN_COLUMNS]
#: read from the shared pass (outlierlab.evaluation.sentence_pass.PASS_NEEDS): its fitted maps with fit_on=sentences
SENTENCE_PASS = fit_on_sentences
#: Below this many pairs a Spearman ρ is printed with a warning (its 95% interval is wider than ±0.35).
FEW_PAIRS = 30
#: How the report says the numbers were made.
METHOD = ("Spearman ρ × 100 between the cosine of mean-pooled sentence vectors (non-special, non-pad tokens) and "
          "the gold scores, as SentEval reports it: per data set every pair pooled, or — where the data have "
          "sub-sets (`sts.subset_field`) — the unweighted mean of the sub-sets' ρ (all rows in sts.csv); the "
          "**mean** row averages the data sets. Best layer = the layer with the highest ρ for that data set.")


def requested(s: StsSettings) -> list[tuple[str, str | list]]:
    """``(name, hub id or [file])`` of every data set asked for (``all`` = the seven of Luo et al. Table 2);
    each local file is its own data set, named by its file name."""
    names = list(s.datasets)
    if "all" in names:
        names = list(STS_HUB) + [n for n in names if n not in STS_HUB and n != "all"]
    out = [(n, STS_HUB.get(n.lower(), n)) for n in names]
    files = s.files
    if files:
        taken = {n for n, _ in out}
        for f in files:
            name = Path(f).name.removesuffix(".gz")
            while name in taken:  # same file name in two folders
                name = f"{Path(f).parent.name}/{name}"
            taken.add(name)
            out.append((name, [f]))
    return out


class SentenceVectors(LayerRows):
    """Mean-pooled vectors of every text, per layer, on disk (``LayerRows`` of the distinct texts, each
    stored once); ``layer`` gives ``[N, d]`` in text order, a repeated text with the same vector."""

    def __init__(self, num_layers: int, dim: int, index: list[int], n_distinct: int) -> None:
        super().__init__(num_layers, dim, n_distinct, prefix="outlierlab-sts-")
        self.index = torch.tensor(index, dtype=torch.long)

    def layer(self, layer: int) -> torch.Tensor:
        return super().layer(layer)[self.index]


class SentenceMeans(Consumer):
    """Each text's mean token vector in every layer, appended to ``out`` (a stream consumer)."""

    def __init__(self, out: SentenceVectors, n_texts: int) -> None:
        self.out, self.ok = out, torch.zeros(n_texts, dtype=torch.bool)

    def update(self, layer: int, vectors: torch.Tensor, batch: StreamBatch) -> None:
        ids = batch.sentence_ids
        count = torch.bincount(ids, minlength=batch.n_rows)
        has = count > 0
        if not bool(has.any()):
            return
        sums = torch.zeros(batch.n_rows, vectors.shape[-1], device=vectors.device).index_add_(0, ids, vectors[0])
        self.out.append(layer, (sums[has] / count[has, None]).cpu())
        if layer == 0:
            rows = torch.tensor(batch.rows)[has.cpu()]
            self.out.add_rows(rows.tolist())
            self.ok[rows] = True


def sentence_vectors(encoder, texts: list[str], batch_size=None, progress: bool = False,
                     notes: list[str] | None = None, what: str = "STS") -> tuple[SentenceVectors, torch.Tensor]:
    """Mean-pooled vectors of every text (``SentenceVectors``, float32 ``[N, d]`` per layer on disk) and Bool[N] (text
    had a token).  Distinct texts are encoded once (``notes`` says how many); each layer is pooled and written as
    produced, so the ``(L+1)·N·d`` vectors (21 GiB at 70B) are never in memory together."""
    unique, index = distinct_texts(texts)
    n_layers, dim = encoder.num_layers + 1, encoder.hidden_size
    check_room(encoder, [], "STS's sentence vectors", "set TMPDIR to a larger disk or evaluate fewer pairs "
               "(sts.max_pairs=)", extra_bytes=len(unique) * n_layers * dim * 4)
    out = SentenceVectors(n_layers, dim, index, len(unique))
    means = SentenceMeans(out, len(unique))
    stream = LayerStream(encoder, unique, batch_size=batch_size, progress=progress)
    try:
        stream.forward([means], desc=what)
        out.close()
    except BaseException:
        out.cleanup()
        raise
    if notes is not None:
        notes += [encode_log_line(what, stream.logs[0].n_texts, len(texts)), *stream.notes]
    return out, means.ok[torch.tensor(index, dtype=torch.long)]


def pair_rows(vecs: SentenceVectors, layer: int, keep: torch.Tensor) -> torch.Tensor:
    """``[2m, d]`` of ``layer``: the kept pairs' sentence1 vectors, then their sentence2 vectors."""
    v = vecs.layer(layer)
    n = v.shape[0] // 2
    return torch.cat([v[keep], v[n + keep]])


def _precheck_whitening(ctx, name: str, pairs: StsPairs, whiten: WhitenSettings) -> None:
    """With ``fit_on=eval`` the fitted transforms are fitted on the pairs' own sentence vectors: too few
    distinct texts fail here, before anything is encoded (the same rule as ``Whitener.check``)."""
    n_distinct = len(set(pairs.s1) | set(pairs.s2))
    dim = ctx.encoder.hidden_size
    for method in (n for n in ctx.transforms if n in FITTED):
        p = fit_size(method, dim, k=whiten.k, abtt_d=whiten.abtt_d)
        if whiten.allow_degenerate or n_distinct >= math.ceil(whiten.min_ratio * p):
            continue
        what = {"whiten": f"k={p}", "abtt": f"D+1={p}", "standardize": "2 (a mean and a scale per dim)",
                "center": "1 (the mean)"}[method]
        override = {"whiten": f"transform.k={max(1, int(n_distinct // whiten.min_ratio))}",
                    "abtt": f"transform.abtt_d={max(0, int(n_distinct // whiten.min_ratio) - 1)}"}.get(method)
        fix = {"whiten": f"keep fewer dims with {override} or less (Su et al. 2021 keep 256 of 768), ",
               "abtt": f"remove fewer directions with {override}, "}.get(method, "")
        problem = (f"{method} fit on the mean-pooled sentence vectors of STS {name} ({pairs.what}) would be "
                   f"degenerate: {n_distinct} distinct texts < {whiten.min_ratio:g} x {what}"
                   + (" (every fitted vector degenerates: for whiten every cosine would be equal)"
                      if n_distinct <= p else ""))
        raise DegenerateWhiteningError(
            f"{problem}; fit on more data (transform.fit_on=sentences or a larger split), or {fix}"
            "or keep the result marked degenerate with transform.allow_degenerate=true",
            problem=problem, need=math.ceil(whiten.min_ratio * p), found=n_distinct, unit="texts",
            fixes=(override,) if override else (), method=method)


@dataclass
class StsData:
    """What ``check`` loads before any encoding and ``run`` evaluates (``EvalContext.prepared``)."""

    data: dict[str, StsPairs]  # data set name -> its evaluated split
    fit: dict[str, StsPairs | str]  # transform.fit_on=<split>: the pairs to fit on, or why they are unavailable


def check(ctx: EvalContext) -> StsData:
    """Load every requested data set before any encoding (an offline hub name fails in seconds)."""
    s = ctx.settings(StsSettings)
    split, t = s.split, ctx.settings(TransformSettings)
    fit_on = t.fit_on
    whiten = WhitenSettings.from_settings(t)
    data, fit = {}, {}
    for name, source in requested(s):
        data[name] = load_sts_pairs(source, split, s.max_pairs, s.subset_field)
        fitted = any(n in FITTED for n in ctx.transforms)
        if fitted and fit_on not in ("eval", "sentences", split) and not isinstance(source, list):
            try:
                fit[name] = load_sts_pairs(source, fit_on)
            except ConnectionError as e:  # e.g. STS13-16 / SICK-R have no train split on the hub
                fit[name] = str(e).split(";")[0]
        fits_on_pairs = fit_on in ("eval", split) or not isinstance(fit.get(name), StsPairs)
        if fitted and fit_on != "sentences" and fits_on_pairs:
            _precheck_whitening(ctx, name, data[name], whiten)
    return StsData(data, fit)


def _whiten(ctx, name: str, vecs: SentenceVectors, keep: torch.Tensor, fit: StsPairs | str | None,
            t: TransformSettings, split: str, ft: FittedTransforms) -> None:
    """Fit every selected fitted transform (whiten, standardize, abtt, center) of data set ``name`` into ``ft``;
    one layer's vectors, float64 sums and maps in memory at a time (the maps are kept on disk)."""
    whiten, fit_on = WhitenSettings.from_settings(t), t.fit_on
    names = [n for n in ctx.transforms if n in FITTED]
    n_layers, dim = vecs.num_layers, vecs.dim
    if fit_on == "sentences":
        borrow_fitted_maps(ctx, ft, names)
        return
    if fit_on not in ("eval", split) and isinstance(fit, StsPairs):
        batch_size = ctx.settings(EncoderSettings).batch_size
        v, ok = sentence_vectors(ctx.encoder, fit.s1 + fit.s2, batch_size)
        w = whiten.fit_by_layer(n_layers, dim, lambda layer: [v.layer(layer)[ok]], names, on_disk=True)
        v.cleanup()
        ft.set_all(whiten.fit_all(w, names, f"the mean-pooled sentence vectors of {fit.what}"), source=w)
        return
    # one layer's float64 sums at a time; the same fit as partial_fit over [L, N, d]
    w = whiten.fit_by_layer(n_layers, dim, lambda layer: [pair_rows(vecs, layer, keep)], names, on_disk=True)
    note = ("" if fit_on in ("eval", split)
            else f" (split {fit_on!r} unavailable: {fit}; fell back to the evaluated pairs)")
    ft.set_all(whiten.fit_all(w, names, f"the mean-pooled sentence vectors of the evaluated pairs of {name}{note}"),
               source=w)


def _rho_rows(name: str, t: str, rho: torch.Tensor, subset: str, split: str, n: int, extra: dict) -> list[dict]:
    return [{"layer": layer, "transform": t, "dataset": name, "subset": subset, "split": split,
             "spearman": float(r), "n_pairs": n, **extra} for layer, r in enumerate(rho.tolist())]


def score_dataset(name: str, pairs: StsPairs, vecs: SentenceVectors, keep: torch.Tensor, ft: FittedTransforms,
                  transforms: list[str], split: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """Rows (pooled ``all``, per sub-set, sub-set ``mean``) and the headline ρ per layer of each transform."""
    m = keep.numel()
    gold = pairs.gold[keep]
    subsets = None if pairs.subsets is None else [pairs.subsets[i] for i in keep.tolist()]
    cosines = pair_cosines(ft, transforms, vecs.num_layers, vecs.dim,
                           lambda layer: pair_rows(vecs, layer, keep).view(2, m, vecs.dim))
    rows, headline = [], {}
    for t in transforms:
        cos = cosines[t]  # [L, P]
        extra = ft.columns(t)
        pooled = sts_spearman(cos, gold)
        rows += _rho_rows(name, t, pooled, "all", split, m, extra)
        headline[t] = pooled
        if subsets is not None and len(set(subsets)) > 1:
            per = []
            for g in sorted(set(subsets)):
                idx = torch.tensor([i for i, s in enumerate(subsets) if s == g])
                if idx.numel() < 2:
                    continue
                rho = sts_spearman(cos[:, idx], gold[idx])
                per.append(rho)
                rows += _rho_rows(name, t, rho, g, split, idx.numel(), extra)
            if per:
                headline[t] = torch.stack(per).mean(0)  # SentEval: unweighted mean of the sub-sets
                rows += _rho_rows(name, t, headline[t], "mean", split, m, extra)
    return rows, headline


def run(ctx: EvalContext) -> AnalysisResult:
    head = "## Semantic Textual Similarity (Luo et al. 2021 §4.3, Table 2)"
    prepared = ctx.prepared if isinstance(ctx.prepared, StsData) else check(ctx)
    data = prepared.data
    if not data:
        md = (f"{head}\n\n**Skipped: no STS data given.** No STS set can be shipped with outlierlab. Run with "
              "`sts.datasets=[stsb,sickr,sts12,sts13,sts14,sts15,sts16]` (or `sts=paper`; Hugging Face hub "
              f"names {', '.join(f'{k}={v}' for k, v in STS_HUB.items())}; they need network once, then the local "
              "datasets cache) or with local pairs `sts.files=[pairs.csv]` (columns sentence1, sentence2, score).")
        return AnalysisResult("sts", [], md, [], {"skipped": "no sts.datasets / sts.files given"})
    enc, transforms = ctx.encoder, list(ctx.transforms)
    split, t = ctx.settings(StsSettings).split, ctx.settings(TransformSettings)
    batch_size = ctx.settings(EncoderSettings).batch_size
    rows, notes, infos, curves, headlines = [], [], {}, {}, {}
    for name, pairs in data.items():
        vecs, ok = sentence_vectors(enc, pairs.s1 + pairs.s2, batch_size, bool(ctx.root_cfg.progress), notes,
                                    f"STS {name}")
        n = len(pairs.s1)
        keep = (ok[:n] & ok[n:]).nonzero().flatten()
        if keep.numel() < n:
            notes.append(f"{name}: {n - keep.numel()} pairs dropped (a sentence with no token)")
        if keep.numel() < FEW_PAIRS:
            notes.append(f"{name}: only {keep.numel()} pairs — ρ is valid but its 95% interval is wide "
                         f"(use >= {FEW_PAIRS} pairs)")
        ft = task_transforms(ctx)
        if any(n in FITTED for n in transforms):
            _whiten(ctx, name, vecs, keep, prepared.fit.get(name), t, split, ft)
        ds_rows, headlines[name] = score_dataset(name, pairs, vecs, keep, ft, transforms,
                                                 "" if pairs.local else split)
        vecs.cleanup()
        rows += ds_rows
        # a comprehension: its loop name does not rebind ``t``, the transform settings of the next data set's fit
        curves.update({f"{name} {tr}": headlines[name][tr].tolist() for tr in transforms})
        infos[name] = {**ft.info, "data": pairs.what, "n_pairs": keep.numel(),
                       "subsets": sorted(set(pairs.subsets)) if pairs.subsets else []}
    mean = {t: torch.stack([h[t] for h in headlines.values()]).mean(0) for t in transforms}
    for t in transforms:
        rows += _rho_rows("mean", t, mean[t], "headline", "", sum(i["n_pairs"] for i in infos.values()), {})
    fig = plot_layers(ctx.out_dir / "sts.png", curves, "Spearman ρ", "STS: cosine of mean-pooled vectors vs gold"
                      ) if ctx.plots else None
    md = [head, METHOD, "\n".join(
        [*(f"- {n}: {i['data']}, {i['n_pairs']} pairs" + (f", sub-sets {', '.join(i['subsets'])}" if i["subsets"]
                                                            else "") + "; "
           + "; ".join(f"**{t}**: {i[t]}" for t in transforms if t in i) for n, i in infos.items()),
         *(f"- note: {x}" for x in notes)]),
          md_table(["dataset", *(f"last layer {t}" for t in transforms), *(f"best layer {t}" for t in transforms)],
                   _table(headlines, mean, transforms), 1), "![STS per layer](sts.png)"]
    summary = {"datasets": infos, "aggregation": "per data set (sub-set mean where sub-sets exist), mean over "
                                                  "data sets", "mean_last_layer": {t: float(mean[t][-1])
                                                                                   for t in transforms},
               "notes": notes}
    return AnalysisResult("sts", rows, "\n\n".join(md), [fig], summary)


def _table(headlines: dict, mean: dict, transforms: list[str]) -> list[list]:
    def best(rho: torch.Tensor) -> str:
        r = torch.nan_to_num(rho, nan=-2.0)
        i = int(r.argmax())
        return f"{100 * float(rho[i]):.1f} (L{i})"

    table = [[n, *(100 * float(h[t][-1]) for t in transforms), *(best(h[t]) for t in transforms)]
             for n, h in headlines.items()]
    return table + [["**mean**", *(100 * float(mean[t][-1]) for t in transforms),
                     *(best(mean[t]) for t in transforms)]]
