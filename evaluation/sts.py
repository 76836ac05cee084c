"""Semantic Textual Similarity, every layer, before/after clip and whiten (Luo et al. 2021 §4.3, Table 2; SentEval).

Sentence vector = mean of its non-special, non-pad token vectors (:func:`analysis.sts.mean_pool`); score =
cosine of the two sentence vectors; quality = Spearman's ρ with the gold scores
(:func:`analysis.sts.sts_spearman`).  Aggregation: **"all"** — every pair of a dataset's split pooled into
one correlation (SentEval's per-genre averages are not computed).  Clip and whiten are affine, so
transforming the mean-pooled vector equals pooling the transformed tokens.

No STS data can be shipped (licences), so by default this analysis is skipped with a note.  Give
``sts.datasets=[stsb,sickr,sts12,...]`` (Hugging Face hub names through ``datasets``; offline they must be
in the local datasets cache, else one clear line) or ``sts.files=[pairs.csv]`` (columns sentence1,
sentence2, score; .csv/.tsv/.json/.jsonl).
"""

from __future__ import annotations

import torch

from analysis.similarity import pairwise_cosine
from analysis.sts import mean_pool, sts_spearman
from analysis.transforms import Whitener
from evaluation.registry import AnalysisResult, EvalContext, register
from reports.evaluation_report import md_table, plot_layers
from datamodules.dataset_sources import load_hub, load_local
from evaluation.streaming import (EncodeLog, FittedTransforms, _get, clip_dims_for_tasks, finish_encode_log,
                                  iter_batches, progress_bar, sentence_stats)

#: Short names → hub ids (all with columns sentence1, sentence2, score).  STS-B scores are in [0, 1],
#: the others in [0, 5]; Spearman does not care.
HUB = {
    "stsb": "sentence-transformers/stsb",
    "sickr": "mteb/sickr-sts",
    "sts12": "mteb/sts12-sts",
    "sts13": "mteb/sts13-sts",
    "sts14": "mteb/sts14-sts",
    "sts15": "mteb/sts15-sts",
    "sts16": "mteb/sts16-sts",
}
COLUMNS = ["layer", "transform", "dataset", "split", "spearman", "n_pairs"]
FIELDS = ("sentence1", "sentence2", "score")
ADVICE = "pass local pairs instead: sts.files=[pairs.csv] (columns sentence1, sentence2, score)"


def requested(cfg) -> list[tuple[str, str | list]]:
    """``(name, hub id or files)`` of every dataset asked for (``all`` = the seven of Luo et al. Table 2)."""
    names = [str(n) for n in (_get(cfg, "datasets") or [])]
    if "all" in names:
        names = list(HUB) + [n for n in names if n not in HUB and n != "all"]
    out = [(n, HUB.get(n.lower(), n)) for n in names]
    files = _get(cfg, "files")
    if files:
        files = [str(files)] if isinstance(files, str) else [str(f) for f in files]
        out.append(("local", files))
    return out


def load_pairs(name: str, source, split: str, cap=None) -> tuple[list[str], list[str], torch.Tensor, str]:
    """(sentences1, sentences2, gold scores, description) of one dataset split."""
    if isinstance(source, list):
        ds, what = load_local(source, FIELDS, "sts"), f"local files {source}"
    else:
        ds, what = load_hub(source, None, split, ADVICE), f"{source} ({split})"
        missing = [c for c in FIELDS if c not in ds.column_names]
        if missing:
            raise ValueError(f"STS dataset {source} lacks column(s) {missing} (columns: {ds.column_names})")
    s1, s2, gold = list(ds["sentence1"]), list(ds["sentence2"]), torch.tensor(ds["score"], dtype=torch.float64)
    if cap is not None and int(cap) < len(s1):
        s1, s2, gold = s1[:int(cap)], s2[:int(cap)], gold[:int(cap)]
    if len(s1) < 2:
        raise ValueError(f"STS dataset {what} has fewer than 2 pairs")
    return s1, s2, gold, what


def sentence_vectors(encoder, texts: list[str], batch_size=None, progress: bool = False,
                     stats: EncodeLog | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean-pooled vectors ``[L+1, N, d]`` (float32, CPU) of every text and Bool[N] (text had a token)."""
    n_layers, dim = encoder.num_layers + 1, encoder.hidden_size
    out = torch.zeros(n_layers, len(texts), dim)
    ok = torch.zeros(len(texts), dtype=torch.bool)
    bar = progress_bar(len(texts), "STS", progress)
    for b in iter_batches(encoder, texts, batch_size, bar=bar, stats=stats):
        has = b.valid.any(1)
        if has.any():
            rows = torch.tensor(b.rows)[has.cpu()]
            out[:, rows] = mean_pool(b.hidden[:, has], b.valid[has]).cpu()
            ok[rows] = True
    if bar is not None:
        bar.close()
    return out, ok


def check(ctx: EvalContext) -> None:
    """Load every requested dataset before any encoding (an offline hub name fails in seconds)."""
    cfg, split = ctx.cfg, str(_get(ctx.cfg, "split", "test"))
    fit_on = str(_get(ctx.root_cfg.get("transform"), "fit_on", "eval"))
    data, fit = {}, {}
    for name, source in requested(cfg):
        data[name] = load_pairs(name, source, split, _get(cfg, "max_pairs"))
        if "whiten" in ctx.transforms and fit_on not in ("eval", "sentences", split) and not isinstance(source, list):
            try:
                fit[name] = load_pairs(name, source, fit_on)
            except ConnectionError as e:  # e.g. STS13-16 / SICK-R have no train split on the hub
                fit[name] = str(e).split(";")[0]
    ctx.shared["sts_data"], ctx.shared["sts_fit"] = data, fit


def _whiten(ctx, name: str, vecs: torch.Tensor, fit_on: str, split: str) -> tuple[Whitener, str]:
    k = _get(ctx.root_cfg.get("transform"), "k")
    n_layers, _, dim = vecs.shape
    if fit_on == "sentences":
        st = sentence_stats(ctx)
        return st.transforms.whitener, st.transforms.info["whiten"]
    fit = ctx.shared["sts_fit"].get(name)
    if fit_on not in ("eval", split) and isinstance(fit, tuple):
        s1, s2, _, what = fit
        v, ok = sentence_vectors(ctx.encoder, s1 + s2, _get(ctx.root_cfg.get("encoder"), "batch_size"))
        w = Whitener(n_layers, dim, k=k).fit(v[:, ok])
        return w, f"fit on the {w.n} mean-pooled sentence vectors of {what}"
    w = Whitener(n_layers, dim, k=k).fit(vecs)
    note = ("" if fit_on in ("eval", split)
            else f" (split {fit_on!r} unavailable: {fit}; fell back to the evaluated pairs)")
    return w, f"fit on the {w.n} mean-pooled sentence vectors of the evaluated pairs (Su et al. 2021){note}"


@register("sts")
def run(ctx: EvalContext) -> AnalysisResult:
    head = "## Semantic Textual Similarity (Luo et al. 2021 §4.3, Table 2)"
    if "sts_data" not in ctx.shared:
        check(ctx)
    data = ctx.shared["sts_data"]
    if not data:
        md = (f"{head}\n\n**Skipped: no STS data given.** No STS set can be shipped with outlierlab. Run with "
              "`sts.datasets=[stsb,sickr,sts12,sts13,sts14,sts15,sts16]` (or `sts=paper`; Hugging Face hub "
              f"names {', '.join(f'{k}={v}' for k, v in HUB.items())}; they need network once, then the local "
              "datasets cache) or with local pairs `sts.files=[pairs.csv]` (columns sentence1, sentence2, score).")
        return AnalysisResult("sts", [], md, [], {"skipped": "no sts.datasets / sts.files given"})
    enc, cfg = ctx.encoder, ctx.cfg
    split, fit_on = str(_get(cfg, "split", "test")), str(_get(ctx.root_cfg.get("transform"), "fit_on", "eval"))
    clip_dims, clip_info = clip_dims_for_tasks(ctx)
    rows, notes, infos, curves = [], [], {}, {}
    for name, (s1, s2, gold, what) in data.items():
        stats = EncodeLog()
        vecs, ok = sentence_vectors(enc, s1 + s2, _get(ctx.root_cfg.get("encoder"), "batch_size"),
                                    bool(ctx.root_cfg.get("progress", False)), stats)
        finish_encode_log(stats, f"STS {name}", notes)
        n = len(s1)
        keep = (ok[:n] & ok[n:]).nonzero().flatten()
        if keep.numel() < n:
            notes.append(f"{name}: {n - keep.numel()} pairs dropped (a sentence with no token)")
        v = torch.cat([vecs[:, keep], vecs[:, n + keep]], 1)
        ft = FittedTransforms(clip_dims=clip_dims, info={"clip": clip_info} if clip_info else {})
        if "whiten" in ctx.transforms:
            ft.whitener, ft.info["whiten"] = _whiten(ctx, name, v, fit_on, split)
        m = keep.numel()
        for t in ctx.transforms:
            tv = ft.apply(t, v)
            rho = sts_spearman(pairwise_cosine(tv[:, :m], tv[:, m:]), gold[keep])
            curves[f"{name} {t}"] = rho.tolist()
            rows += [{"layer": layer, "transform": t, "dataset": name, "split": split if name != "local" else "",
                      "spearman": float(r), "n_pairs": m} for layer, r in enumerate(rho.tolist())]
        infos[name] = {**ft.info, "data": what, "n_pairs": m}
    fig = plot_layers(ctx.out_dir / "sts.png", curves, "Spearman ρ", "STS: cosine of mean-pooled vectors vs gold")
    transforms, names = list(ctx.transforms), list(data)

    def pick(name, t, how):
        rs = [r for r in rows if r["dataset"] == name and r["transform"] == t]
        if how == "last":
            return 100 * rs[-1]["spearman"]
        b = max(rs, key=lambda r: r["spearman"] if r["spearman"] == r["spearman"] else -2)
        return f"{100 * b['spearman']:.1f} (L{b['layer']})"

    table = [[n, *(pick(n, t, "last") for t in transforms), *(pick(n, t, "best") for t in transforms)] for n in names]
    md = [head, f"Spearman ρ × 100 between the cosine of mean-pooled sentence vectors (non-special, non-pad tokens) "
                "and the gold scores; aggregation **all** (every pair of the split pooled per dataset).",
          "\n".join([*(f"- {n}: {i['data']}, {i['n_pairs']} pairs; " + "; ".join(
              f"**{t}**: {i[t]}" for t in transforms if t in i) for n, i in infos.items()),
              *(f"- note: {x}" for x in notes)]),
          md_table(["dataset", *(f"last layer {t}" for t in transforms), *(f"best layer {t}" for t in transforms)],
                   table, 1), "![STS per layer](sts.png)"]
    summary = {"datasets": infos, "aggregation": "all", "notes": notes}
    return AnalysisResult("sts", rows, "\n\n".join(md), [fig], summary)
