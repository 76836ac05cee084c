"""Writing what ``evaluate.py`` found: ``<analysis>.csv``, ``report.md``, ``results.json``, PNG plots and
TensorBoard text ``eval/<analysis>/<transform>``: a table with a row per layer.

Plain files first (DESIGN: results readable without TensorBoard); matplotlib with the Agg backend.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import StepPatch
from matplotlib.ticker import MaxNLocator

from outlierlab.utils.atomic import save_figure, write_atomic
from outlierlab.utils.tables import columns_of, joined, md_table, write_csv

#: Columns that identify a row rather than measure something (not a column of TensorBoard's tables).
KEY_COLUMNS = ("layer", "transform", "dataset", "split")
#: Columns that say what a fitted transform was fitted on (not scalars either): whiten_n, abtt_d, ...
FIT_PREFIXES = ("whiten_", "standardize_", "abtt_", "center_")


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "tolist"):
        return _jsonable(v.tolist())
    if isinstance(v, Path):
        return str(v)
    return v


# ------------------------------------------------------------------------------------------- TensorBoard
def log_tables(tb, prefix: str, rows: Sequence[Mapping[str, Any]]) -> int:
    """The per-layer values as TensorBoard text, one Markdown table per ``<prefix>/<transform>[/<dataset>][/<subset>]``
    (a row per layer); returns the number of tables.  Not scalars: TensorBoard would smooth them on a step axis."""
    if tb is None:
        return 0
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if "layer" not in r or "transform" not in r:
            continue
        tag = f"{prefix}/{r['transform']}" + (f"/{r['dataset']}" if r.get("dataset") else "") + (
            f"/{r['subset']}" if r.get("subset") not in (None, "", "all") else "")  # STS sub-sets, SentEval-style
        groups.setdefault(tag, []).append(r)
    for tag, group in groups.items():
        stats = [k for k in columns_of(group) if k not in KEY_COLUMNS and k != "subset"
                 and not k.startswith(FIT_PREFIXES)
                 and any(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) for r in group)]
        cells = [[r["layer"], *(r.get(k) if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                                else float("nan") for k in stats)] for r in group]
        tb.add_text(tag, md_table(["layer", *stats], cells, cell=_tb_cell))
    return len(groups)


def _tb_cell(x: Any) -> str:
    if isinstance(x, float):
        return "–" if not math.isfinite(x) else f"{x:.4g}"
    return str(x)


# ------------------------------------------------------------------------------------------------- plots
def plot_layers(path: Path, series: Mapping[str, Sequence[float]], ylabel: str, title: str,
                hline: float | None = None) -> Path:
    """One line per label over layers 0..L (0 = embedding output) — the shape of Luo et al. Fig. 6."""
    # Fixed margins (inches) on a bare Figure, as the monitors' figures: tight_layout's extra draw to measure every
    # label was half of each figure's cost, and pyplot (its import, its figure manager) is not needed to write a PNG
    width, height = 6.0, 3.6
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.85 / width, right=1 - 0.15 / width, bottom=0.5 / height, top=1 - 0.35 / height)
    ax = fig.add_subplot()
    for label, ys in series.items():
        ax.plot(range(len(ys)), ys, marker="o", ms=3, label=label)
    if hline is not None:
        ax.axhline(hline, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("layer (0 = embeddings)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole: no "1.5" ticks
    ax.set_ylabel(ylabel)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))  # short tick labels: the margin is fixed
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)
    return path


def plot_vectors(path: Path, vectors: Sequence[Sequence[float]], titles: Sequence[str],
                 marks: Sequence[Sequence[int]] | None = None, suptitle: str = "", ncols: int = 4) -> Path:
    """Small multiples of d-dim vectors, marked dims annotated (Luo et al. Figs. 1–4)."""
    n = len(vectors)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    width = 3.2 * ncols
    title = textwrap.wrap(suptitle, int(width * 13))  # ~13 characters of 10 pt per inch: one panel's width wraps
    head = 0.25 + (0.1 + 0.18 * len(title) if title else 0.0)  # inches above the panels: suptitle, panel titles
    height = 2.2 * nrows + head - 0.25
    fig = Figure(figsize=(width, height))  # fixed margins, as plot_layers: no tight_layout draw
    left, right, bottom, gap_w, gap_h = 0.45, 0.1, 0.3, 0.45, 0.5  # inches; gaps hold tick labels and titles
    panel_w = (width - left - right - (ncols - 1) * gap_w) / ncols
    panel_h = (height - head - bottom - (nrows - 1) * gap_h) / nrows
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - head / height,
                        wspace=gap_w / panel_w, hspace=gap_h / panel_h)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        v = list(vectors[i])
        _bars(ax, v)
        for dim in (marks[i] if marks else [])[:4]:
            ax.annotate(str(dim), (dim, v[dim]), fontsize=7, color="tab:red", ha="center",
                        va="bottom" if v[dim] >= 0 else "top")
        ax.set_title(titles[i], fontsize=8)
        ax.tick_params(labelsize=6)
    if title:
        fig.suptitle("\n".join(title), fontsize=10, y=1 - 0.06 / height, va="top")
    save_figure(fig, path, dpi=110)
    return path


def _bars(ax, v: Sequence[float]) -> None:
    """Unit-width bars of ``v`` from 0 as ONE filled step patch, pixel for pixel ``ax.stairs(v, edges, fill=True)``,
    with the data limits set directly and the patch out of the layout (``ax.bar``/``ax.stairs`` took 18 s for a 70B
    model's 81 × 8,192 figure)."""
    edges = [k - 0.5 for k in range(len(v) + 1)]
    patch = StepPatch(v, edges, fill=True, baseline=0.0, facecolor="tab:blue", linewidth=0)  # as stairs
    ax.add_artist(patch)  # add_patch would update the data limits from the path, segment by segment
    patch.set_in_layout(False)
    patch.sticky_edges.y.append(0.0)  # as ax.stairs: the bars stand on the axis, no margin below 0
    lo, hi = (min(min(v), 0.0), max(max(v), 0.0)) if len(v) else (0.0, 0.0)
    ax.update_datalim([(edges[0], lo), (edges[-1], hi)])
    ax.autoscale_view()


# ------------------------------------------------------------------------------------------------ report
def share_k(ks: Iterable[int]) -> int:
    """The top-k share the reports show: k = 3 (Timkey & van Schijndel) if computed, else the largest."""
    ks = {int(k) for k in ks}
    return 3 if 3 in ks else max(ks)


_SHARE = re.compile(r"top(\d+)_share")


def geometry_table(results: Sequence[Any]) -> str:
    """The Table-1 geometry per layer and transform: anisotropy (Ethayarajh 2019), its top-k share (Timkey & van
    Schijndel 2021) and IsoScore (Rudman et al. 2022); "" when neither analysis ran."""
    by = {r.name: r.rows for r in results if r.name in ("anisotropy", "isotropy")}
    if not by:
        return ""
    computed = {int(m.group(1)) for r in by.get("anisotropy", []) for m in map(_SHARE.fullmatch, r) if m}
    top = share_k(computed) if computed else 3
    cells: dict[tuple[int, str], dict[str, Any]] = {}
    for name, rows in by.items():
        for r in rows:
            c = cells.setdefault((int(r["layer"]), str(r["transform"])), {})
            if name == "anisotropy":
                c.update(aniso=r.get("anisotropy", math.nan), share=r.get(f"top{top}_share", math.nan))
            else:
                c.update(iso=r.get("isoscore", math.nan))
    layers = sorted({k[0] for k in cells})
    transforms = list(dict.fromkeys(k[1] for k in cells))
    parts = [("aniso", "anisotropy"), ("share", f"top-{top} share"), ("iso", "IsoScore")]
    parts = [(key, label) for key, label in parts if any(key in c for c in cells.values())]
    headers = ["layer"] + [f"{t}: {label}" for t in transforms for _, label in parts]
    body = [[layer] + [cells.get((layer, t), {}).get(key, math.nan) for t in transforms for key, _ in parts]
            for layer in layers]
    return ("## Geometry per layer and transform (Table 1 layout)\n\n"
            "Anisotropy = mean cosine of cross-sentence token pairs (Ethayarajh 2019; Luo et al. 2021 §4.1); "
            f"top-{top} share = the part of it the {top} dims of largest contribution CC_i hold (Timkey & van "
            "Schijndel 2021); IsoScore = how uniformly the space's directions carry variance, 1 = isotropic (Rudman et al. "
            "2022). Details in the sections below.\n\n" + md_table(headers, body))


#: A markdown image of a file beside the report: ``![caption](name.png)``.
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s/]+\.png)\)\n?")


def write_report(out_dir: Path, header: str, sections: Sequence[str], drawn: Iterable[str] | None = None) -> Path:
    """``report.md``: the header and sections, linking only the figures this run ``drawn``."""
    path = out_dir / "report.md"
    text = header.rstrip() + "\n\n" + "\n\n".join(s.strip() for s in sections if s.strip()) + "\n"
    if drawn is not None:
        keep = set(drawn)
        text = _IMAGE.sub(lambda m: m.group(0) if m.group(1) in keep else "", text)
    write_atomic(path, text)
    return path


def write_outputs(out_dir: Path, results: Sequence[Any], meta: Mapping[str, Any], header: str,
                  columns: Mapping[str, Sequence[str]] | None = None, tb=None) -> dict[str, Path]:
    """Write each CSV, ``results.json``, ``report.md`` and the TensorBoard tables; ``columns`` fix the headers."""
    out_dir = Path(out_dir)
    paths: dict[str, Path] = {}
    for r in results:
        cols = (columns or {}).get(r.name) or columns_of(r.rows, ("layer", "transform"))
        paths[f"{r.name}.csv"] = write_csv(out_dir / f"{r.name}.csv", r.rows, cols, cell=joined)
        log_tables(tb, f"eval/{r.name}", r.rows)
    # atomic, as the CSVs: a kill or a full disk mid-write left a torn results.json that readers failed to parse
    paths["results.json"] = out_dir / "results.json"
    write_atomic(paths["results.json"], json.dumps(_jsonable({
        "meta": meta,
        "analyses": {r.name: {"summary": r.summary, "rows": r.rows,
                              "figures": [Path(f).name for f in r.figures]} for r in results}}), indent=2))
    paths["report.md"] = write_report(out_dir, header, [geometry_table(results), *(r.markdown for r in results)],
                                      drawn=[Path(f).name for r in results for f in r.figures])
    return paths
