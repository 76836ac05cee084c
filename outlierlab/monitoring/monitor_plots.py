"""Figures of the outlier monitors (matplotlib, Agg canvas; no pyplot state, safe on headless servers).

- ``layernorm_heatmap`` — gain or bias of every LayerNorm per dim over steps, Kovaleva et al. (2021) Fig. 3
  (middle), the 3σ-flagged dims of the latest step marked.
- ``mean_vector_figure`` — the average token vector of every layer, Luo et al. (2021) Figs. 1–2, outliers labelled.

``render`` gives one RGB array for both TensorBoard and the PNG.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.image import imsave
from matplotlib.ticker import LogFormatter, MaxNLocator

from outlierlab.utils.atomic import write_atomic


def render(fig: Figure) -> np.ndarray:
    """RGB uint8 array ``[H, W, 3]`` of ``fig`` (drawn on an Agg canvas)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save_png(image: np.ndarray, path: str | os.PathLike) -> None:
    """Write an RGB array as PNG atomically (``outlierlab.utils.atomic.write_atomic``: encoded in memory, then
    fsync and rename -- a full disk leaves the earlier figure, not a ``.tmp.png`` beside it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    imsave(buf, image, format="png")
    write_atomic(path, buf.getvalue())


def thin(steps: Sequence[int], max_rows: int) -> list[int]:
    """Indices of at most ``max_rows`` evenly spaced entries, always keeping the first and the last."""
    n = len(steps)
    if n <= max_rows:
        return list(range(n))
    return sorted(set(np.linspace(0, n - 1, max_rows).round().astype(int).tolist()))


#: The share of a heatmap's values inside its colour range: the few outlier entries would otherwise set the scale and
#: leave every other cell white (a bias heatmap at ±1.9 for values near 0); they saturate instead and stay marked.
COLOUR_QUANTILE = 0.99


def colour_span(deviation: np.ndarray) -> tuple[float, float]:
    """``(span, largest)``: the ``COLOUR_QUANTILE`` quantile of ``|deviation|`` (the colour range ±span) and its
    largest value; a tiny floor keeps an all-zero map drawable."""
    a = np.abs(np.asarray(deviation, dtype=float))
    a = a[np.isfinite(a)]
    if not a.size:
        return 1e-6, 0.0
    largest = float(a.max())
    return max(float(np.quantile(a, COLOUR_QUANTILE)), 1e-6), largest


def layernorm_heatmap(steps: Sequence[int], values: Mapping[str, np.ndarray], flagged: Mapping[str, Sequence[int]],
                      part: str, centre: float) -> Figure:
    """Heatmap per LayerNorm: rows = the S ``steps`` (oldest on top), columns = dims, colour = ``values[name]`` [S, d];
    ``flagged`` dims marked with red triangles; ``centre`` (init value) is the diverging map's white."""
    names = list(values)
    # Plain subplots_adjust and no colour bars: constrained layout and one colour-bar axes per panel
    # made this figure cost seconds per draw; the colour range is printed in each title instead.
    height = 0.5 + 0.8 * len(names)
    fig = Figure(figsize=(9, height), dpi=72)
    fig.subplots_adjust(left=0.07, right=0.99, top=1 - 0.62 / height, bottom=0.35 / height, hspace=0.9)
    axes = fig.subplots(len(names), 1, squeeze=False, sharex=True)[:, 0]
    for ax, name in zip(axes, names):
        v = np.asarray(values[name], dtype=float)
        span, largest = colour_span(v - centre)
        ax.imshow(v, aspect="auto", interpolation="nearest", cmap="RdBu_r",
                  norm=Normalize(centre - span, centre + span), extent=(-0.5, v.shape[1] - 0.5, len(steps) - 0.5, -0.5))
        dims = list(flagged.get(name, ()))
        if dims:
            ax.plot(dims, [-0.5] * len(dims), "v", color="red", markersize=4, clip_on=False)
        ax.set_yticks([0, len(steps) - 1], [str(steps[0]), str(steps[-1])])
        saturated = f" (beyond saturates; largest {largest:.3g})" if largest > span else ""
        ax.set_title(f"{name}: colour {centre:g} ± {span:.3g}{saturated};  {len(dims)} dims > 3σ at step {steps[-1]}",
                     fontsize=7, loc="left", pad=2)
        ax.tick_params(labelsize=6, length=2, pad=1)
    axes[-1].set_xlabel("dimension", fontsize=7)
    fig.suptitle(f"LayerNorm {part} per dimension (x) over training steps (y); red ▼ = flagged "
                 "(Kovaleva et al. 2021, Fig. 3)", fontsize=8)
    return fig


def mean_vector_figure(mean: np.ndarray, outliers: Sequence[Sequence[int]], step: int) -> Figure:
    """One panel per layer of ``mean`` [L, d] (row 0 = embedding output), the ``outliers`` dims labelled (Luo et al.
    2021, Figs. 1–2)."""
    mean = np.asarray(mean, dtype=float)
    n, d = mean.shape
    cols = 1 if n <= 4 else 2
    rows = -(-n // cols)
    height = 0.5 + 1.7 * rows  # a panel per layer tall enough to read its dims' bars and labels
    fig = Figure(figsize=(5 * cols, height), dpi=90)
    fig.subplots_adjust(left=0.06, right=0.99, top=1 - 0.45 / height, bottom=0.3 / height, hspace=0.6, wspace=0.12)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    x = np.arange(d)
    for i, ax in enumerate(axes):
        if i >= n:
            ax.set_visible(False)
            continue
        ax.vlines(x, 0, mean[i], linewidth=0.8, color="tab:blue")  # one collection: fast for d = 768
        dims = list(outliers[i])
        label = dims or [int(np.abs(mean[i]).argmax())]
        for dim in label[:5]:
            ax.annotate(str(dim), (dim, mean[i, dim]), fontsize=6, color="red" if dims else "grey",
                        ha="center", va="bottom" if mean[i, dim] >= 0 else "top")
        ax.set_xlim(-0.5, d - 0.5)
        ax.set_title("embeddings" if i == 0 else f"layer {i}", fontsize=7, loc="left", pad=2)
        ax.tick_params(labelsize=6, length=2, pad=1)
    fig.suptitle(f"average token vector per layer at step {step} (Luo et al. 2021, Figs. 1–2); "
                 "red = outlier dims", fontsize=8)
    return fig


#: Per-layer statistics drawn as curves vs step (:func:`metric_curves_figure`), in panel order.
CURVE_STATISTICS = ("kurtosis", "max_median", "argmax_share", "argmin_share", "abs_argmax_share",
                    "inf_norm_ffn_output", "inf_norm_ln_input", "inf_norm_ln_output", "sink_share_bos",
                    "attn_entropy", "attn_row_mass", "anisotropy", "rogue_top3_share", "isoscore",
                    "n_layernorm_outliers")
_LOG_SCALE = {"kurtosis", "max_median", "inf_norm_ffn_output", "inf_norm_ln_input", "inf_norm_ln_output"}


def curves_from_rows(rows: Sequence) -> dict[str, dict[int, tuple[list[int], list[float]]]]:
    """History rows (tuples or dicts) -> ``{statistic: {layer: (steps, values)}}`` for ``CURVE_STATISTICS``."""
    out: dict[str, dict[int, dict[int, float]]] = {}
    for r in rows:
        step, name, stat, _, value = ((r["step"], r["name"], r["statistic"], r["dim"], r["value"])
                                      if isinstance(r, Mapping) else r)
        if stat in CURVE_STATISTICS and str(name).startswith("layer_"):
            out.setdefault(stat, {}).setdefault(int(str(name)[6:]), {})[int(step)] = float(value)
    return {s: {l: (sorted(v), [v[k] for k in sorted(v)]) for l, v in sorted(per.items())}
            for s, per in out.items()}


#: The smallest y range a linear panel spans, as a share of its values' magnitude: a statistic that is constant up
#: to float rounding (a softmax row's mass, 1 ± 1e-7) is drawn as the flat line it is, not as magnified noise.
MIN_RELATIVE_SPAN = 0.01


def _floor_span(ax, values: Sequence[float]) -> None:
    """Widen a linear panel's y range to at least ``MIN_RELATIVE_SPAN`` of its values' magnitude, without the offset
    notation ("1e-7 + 1") that made rounding look like a trend."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    ax.ticklabel_format(axis="y", useOffset=False)
    if not v.size:
        return
    lo, hi, size = float(v.min()), float(v.max()), float(np.abs(v).max())
    floor = MIN_RELATIVE_SPAN * size if size > 0 else 1.0
    if hi - lo < floor:
        mid = (hi + lo) / 2
        ax.set_ylim(mid - floor / 2, mid + floor / 2)


def metric_curves_figure(curves: Mapping[str, Mapping[int, tuple[Sequence[int], Sequence[float]]]],
                         title: str = "") -> Figure:
    """One panel per statistic, one line per layer, vs optimizer step (the emergence view of He et al.
    2024, Fig. 1: kurtosis and max/median on a log axis)."""
    stats = [s for s in CURVE_STATISTICS if s in curves] or ["(no data)"]
    ncols = min(3, len(stats))
    nrows = -(-len(stats) // ncols)
    # Fixed margins at 72 dpi, as the heatmaps: constrained layout took ~2 s per draw of this 15-panel figure
    # (it is drawn at every image record of a training run); the panels' labels fit these margins.  One legend for
    # all panels, in a row of its own above them: the colour of a layer is the same in every panel.
    head = (0.5 if title else 0.0) + 0.35
    width, height = 4.2 * ncols, 2.6 * nrows + head
    fig = Figure(figsize=(width, height), dpi=72)
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.15 / width, bottom=0.5 / height,
                        top=1 - (head + 0.3) / height, wspace=0.28, hspace=0.62)
    layers: dict[int, object] = {}
    for k, stat in enumerate(stats):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        per = curves.get(stat, {})
        for layer, (steps, values) in per.items():
            # colour fixed by layer: panels without layer 0 (sites, sinks) keep the legend's colours
            layers[layer], = ax.plot(steps, values, marker="." if len(steps) < 30 else None, lw=1.2,
                                     color=f"C{layer % 10}")
        if stat in _LOG_SCALE and any(v > 0 for _, vs in per.values() for v in vs):
            ax.set_yscale("log")
            # "3", "1e+04": not "3 × 10⁰", which the fixed margin would cut; minor labels only over < 2 decades
            ax.yaxis.set_major_formatter(LogFormatter())
            ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        else:
            _floor_span(ax, [v for _, vs in per.values() for v in vs])
        ax.set_title(stat, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(which="both", labelsize=7)  # the log panels label minor ticks too
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # optimizer steps
    if layers:
        order = sorted(layers)
        fig.legend([layers[i] for i in order], [f"layer {i}" for i in order], loc="upper center", fontsize=8,
                   ncol=min(len(order), 13), frameon=False, bbox_to_anchor=(0.5, 1 - (head - 0.35) / height))
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def position_rows_figure(table: np.ndarray, stats: Mapping, name: str = "") -> Figure:
    """A position table row by row (Luo et al. 2021, Figs. 3–4): the rows × dims heatmap with the most common
    argmax/argmin dims marked, and per dim the share of rows having it as argmax, argmin or kσ dim
    (``position_row_stats``)."""
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    lim, largest = colour_span(table)
    im = ax.imshow(table, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    for key, color in (("argmax_dim", "k"), ("argmin_dim", "g")):
        ax.axvline(stats[key], color=color, lw=0.8, ls="--", label=f"{key[:6]} dim {stats[key]}")
    ax.set(xlabel="dim", ylabel="position (row)", title=f"{name} ({table.shape[0]} rows)")
    ax.legend(fontsize=7, loc="upper right")
    fig.colorbar(im, ax=ax, shrink=0.8, extend="both" if largest > lim else "neither",
                 label=f"value (±{lim:.3g}; largest |value| {largest:.3g})")
    d = table.shape[1]
    x = np.arange(d)
    for key, label in (("argmax", "argmax"), ("argmin", "argmin")):
        bx.plot(x, np.bincount(np.asarray(stats[key]), minlength=d) / table.shape[0], lw=1, label=label)
    bx.plot(x, np.asarray(stats["sigma_row_share"]), lw=1, label="outside 3σ of its row")
    bx.set(xlabel="dim", ylabel="share of rows", ylim=(0, 1.02), title="per dim: share of position rows")
    bx.legend(fontsize=7)
    return fig
