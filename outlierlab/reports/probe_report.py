"""Plain-file outputs of probe.py: CSV (one row per layer x transform), Markdown table, PNG plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

# Figures without pyplot: drawing to a file neither switches the caller's backend (a notebook's inline plots) nor
# keeps figures open
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from outlierlab.utils.atomic import save_figure, write_atomic
from outlierlab.utils.tables import md_table, write_csv

COLUMNS = ["layer", "transform", "accuracy", "mean_abs_error", "val_accuracy", "chance", "n_train", "n_val", "n_test",
           "dropped_tokens", "truncated_sequences", "top_neurons", "outlier_dims", "outlier_rank",
           "contribution_outlier", "contribution_mean", "clipped_dims",
           # fitted rows: what each map was fitted on (outlierlab.metrics.whitening.WhiteningFit.columns)
           *(f"{m}_{c}" for m in ("whiten", "standardize", "abtt", "center")
             for c in ("fit", "n", "distinct", "rank", *(("k",) if m == "whiten" else ()),
                       *(("d",) if m == "abtt" else ()), "degenerate"))]
#: Columns listing dims or ranks, ";"-separated as in every evaluate.py table ("308;381"; empty: none).
LIST_COLUMNS = ("top_neurons", "outlier_dims", "outlier_rank", "clipped_dims")
#: Under every position-probe report: decodable is not used (docs/order_use.md, "Position probes").
POSITION_CAVEAT = ("- reads: a linear probe finds the position a layer *carries*, not one the model *uses* -- a learned "
                   "table's distinct rows are decodable in a model that ignores word order (docs/order_use.md, "
                   "\"Position probes\"); whether it uses order: the order-use section below (probe.py "
                   "`probe.order_use=true`, the default; or `python evaluate.py encoder.name_or_path=... "
                   "'analyses=[order_use]'`): in nats with a masked or causal LM head, without one how far "
                   "shuffling moves each layer's sentence vectors")
#: Under the position probe of a masked LM of ours without positions (permutation-equivariant, docs/order_use.md).
ORDERLESS_NOTE = ("- this model has no position input (a masked LM with `pos=none`, permutation-equivariant): whatever "
                  "the probe decodes above chance, the tokens themselves carry (capitalised first words, final "
                  "punctuation, how many tokens the sentence has) -- the content baseline a position scheme's probe "
                  "is read against")
#: Transforms whose coordinate i is not neuron i (no outlier-contribution columns or panels).
MIXING = ("whiten", "abtt")


def _fmt(v) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def write_markdown(rows: list[dict], info: dict, path: Path, title: str, sections: Sequence[str] = ()) -> Path:
    cols = ["layer", "transform", "accuracy", "val_accuracy", "top_neurons", "outlier_dims", "outlier_rank",
            "contribution_outlier", "contribution_mean"]
    r0 = rows[0]
    lines = [f"# {title}", "",
             f"- encoder: `{info.get('encoder')}` ({info.get('encoder_kind')}), {info.get('layers')} hidden-state "
             f"layers (0 = embeddings), hidden size {info.get('hidden')}",
             f"- task: `{info.get('task')}`; train/val/test = {r0['n_train']}/{r0['n_val']}/{r0['n_test']}; "
             f"chance (majority class on test) = {r0['chance']:.4f}",
             f"- family: {info.get('family', 'unknown')}",
             f"- {info.get('layernorms', 'LayerNorms: not examined')}",
             f"- transforms: {', '.join(info.get('transforms', []))}; seed {info.get('seed')}",
             f"- dropped tokens: {r0['dropped_tokens']} (truncated sequences: {r0['truncated_sequences']})",
             "- contribution c_i = |w_{y,i} v_i| averaged over test vectors (Luo et al. 2021 §3); outlier dims "
             "detected on the untransformed TRAINING features; outlier_rank 1 = largest contribution; no "
             "outlier columns for whiten and abtt (their coordinates mix neurons; whiten's are principal directions)"]
    if info.get("task") == "position":
        lines.append(POSITION_CAVEAT)
        if info.get("orderless"):
            lines.append(ORDERLESS_NOTE)
    lines += [f"- note: {n}" for n in info.get("notes", [])]
    lines += ["", md_table(cols, ([r[c] for c in cols] for r in rows), cell=_fmt)]
    lines += [part for section in sections for part in ("", section.rstrip("\n"))]
    write_atomic(path, "\n".join(lines) + "\n")
    return path


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def write_plots(rows: list[dict], run_dir: Path, stem: str) -> list[Path]:
    """accuracy vs layer; outlier vs mean contribution per layer; contribution heatmap layers x top dims."""
    transforms = list(dict.fromkeys(r["transform"] for r in rows))
    by_t = {t: [r for r in rows if r["transform"] == t] for t in transforms}
    paths = []

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for t, rs in by_t.items():
        ax.plot([r["layer"] for r in rs], [r["accuracy"] for r in rs], marker="o", label=t)
    ax.axhline(rows[0]["chance"], color="gray", ls="--", lw=1, label="chance")
    ax.set(xlabel="layer (0 = embeddings)", ylabel="test accuracy", title=f"{stem}: accuracy per layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole: no "1.5" ticks
    ax.legend()
    paths.append(_save(fig, run_dir / f"{stem}_accuracy.png"))

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for t, rs in by_t.items():
        if t in MIXING:
            continue
        layers = [r["layer"] for r in rs]
        ax.plot(layers, [r["contribution_outlier"] for r in rs], marker="o", label=f"{t}: outlier neuron")
        ax.plot(layers, [r["contribution_mean"] for r in rs], marker="x", ls="--", label=f"{t}: mean neuron")
    ax.set(xlabel="layer", ylabel="mean |w_y,i v_i|", title="contribution: outlier vs mean neuron (Luo Fig. 5)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    paths.append(_save(fig, run_dir / f"{stem}_contribution.png"))
    return paths


def write_heatmap(contrib: dict, run_dir: Path, stem: str, per_layer: int = 3, extra_dims=()) -> Path | None:
    """Heatmap layers x dims of mean contribution: each layer's top ``per_layer`` dims and ``extra_dims``."""
    panels = {t: c for t, c in contrib.items() if t not in MIXING}
    if not panels:
        return None
    first = next(iter(panels.values()))
    dims = sorted({int(i) for row in first for i in row.topk(min(per_layer, row.numel())).indices}
                  | {int(i) for i in extra_dims if 0 <= int(i) < first.shape[1]})
    fig = Figure(figsize=(1.2 + 0.45 * len(dims) * len(panels), 0.4 * first.shape[0] + 1.5))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (t, c) in zip(axes[0], panels.items()):
        im = ax.imshow(c[:, dims].numpy(), aspect="auto", cmap="viridis")
        ax.set(xticks=range(len(dims)), yticks=range(c.shape[0]), xlabel="dim", ylabel="layer", title=t)
        ax.set_xticklabels(dims, rotation=90, fontsize=7)
        fig.colorbar(im, ax=ax)
    fig.suptitle("contribution |w_y,i v_i| (layers x top dims)")
    return _save(fig, run_dir / f"{stem}_contribution_heatmap.png")


def write_outputs(rows: list[dict], info: dict, run_dir: Path, stem: str, contrib: dict | None = None,
                  sections: Sequence[str] = ()) -> list[Path]:
    """Write ``<stem>.csv``, ``probe_report.md`` (``sections`` appended) and the PNGs; return the paths."""
    run_dir = Path(run_dir)
    title = "Position probe (Luo et al. 2021 §3)" if stem == "position_probe" else \
        "Linear classifier on sentence vectors (Luo et al. 2021 §4.4)"
    paths = [write_csv(run_dir / f"{stem}.csv", rows, COLUMNS),
             write_markdown(rows, info, run_dir / "probe_report.md", title, sections)]
    paths += write_plots(rows, run_dir, stem)
    if contrib:
        extra = {d for layer in info.get("outlier_dims", []) for d in layer}
        heat = write_heatmap(contrib, run_dir, stem, extra_dims=extra)
        if heat is not None:
            paths.append(heat)
    return paths
