"""``study.md`` and the confidence-band curves of a seed study (:mod:`outlierlab.jobs.study`)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from outlierlab.analysis.seed_statistics import CI_METHOD


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    a = abs(x)
    return f"{x:.3g}" if a >= 100 or a < 0.01 and a > 0 else f"{x:.3f}"


def _pm(row: pd.Series) -> str:
    half = (row["ci_high"] - row["mean"]) if math.isfinite(row["ci_high"]) else math.nan
    return f"{_fmt(row['mean'])} ± {_fmt(half)} (n={int(row['n'])})"


def _nearest(available: Sequence[int], step: int) -> int | None:
    return min(available, key=lambda s: abs(s - step)) if len(available) else None


def write_markdown(path: Path, sources: Sequence[str], summary: pd.DataFrame, contrasts: Mapping[str, pd.DataFrame],
                   groups: Mapping[str, list], unfinished: list, metrics: Sequence[str], steps: Sequence[int],
                   layers: Sequence[str]) -> Path:
    lines = [f"# Study: {', '.join(map(str, sources))}", "",
             f"Every number: the mean over seeds ± the half-width of its 95% confidence interval ({CI_METHOD}, "
             "n − 1 degrees of freedom), n = seeds. `max_layer`: the largest value over the encoder layers, "
             "taken within each run before averaging.", "", "## Groups", "", "| group | seeds | cells |", "|---|---|---|"]
    for label, cells in groups.items():
        seeds = ", ".join(str(c.seed) for c in sorted(cells, key=lambda c: (c.seed is None, c.seed)))
        lines.append(f"| {label} | {seeds} | {', '.join(c.path.name for c in cells)} |")
    if unfinished:
        lines += ["", f"**Unfinished, left out ({len(unfinished)}):** " + ", ".join(c.path.name for c in unfinished)]
    group_names = list(groups)
    lines += ["", "## Headline metrics", ""]
    lines.append("| metric | layer | step | " + " | ".join(group_names) + " |")
    lines.append("|---|---|---|" + "---|" * len(group_names))
    for metric in metrics:
        for layer in layers:
            sub = summary[(summary["metric"] == metric) & (summary["layer"] == layer)]
            if sub.empty:
                continue
            available = sorted(sub["step"].unique())
            for near in sorted({_nearest(available, step) for step in steps}):
                cells = []
                for g in group_names:
                    r = sub[(sub["group"] == g) & (sub["step"] == near)]
                    cells.append(_pm(r.iloc[0]) if len(r) else "–")
                lines.append(f"| {metric} | {layer} | {near} | " + " | ".join(cells) + " |")
    for spec, table in contrasts.items():
        lines += ["", f"## Contrast {spec}", "",
                  "diff = mean(a) − mean(b) with its 95% CI: a paired t interval over the per-seed differences when "
                  "both groups hold the same seeds, else Welch's. *ordering*: in how many seeds a − b has the sign "
                  "of the mean difference (paired), or whether the two groups' runs overlap (Welch).", "",
                  "| metric | layer | step | a | b | mean a | mean b | diff [95% CI] | test | p | ordering |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for metric in metrics:
            for layer in layers:
                sub = table[(table["metric"] == metric) & (table["layer"] == layer)] if not table.empty else table
                if sub.empty:
                    continue
                available = sorted(sub["step"].unique())
                for near in sorted({_nearest(available, step) for step in steps}):
                    for _, r in sub[sub["step"] == near].iterrows():
                        lines.append(f"| {metric} | {layer} | {near} | {r['group_a']} | {r['group_b']} | "
                                     f"{_fmt(r['mean_a'])} | {_fmt(r['mean_b'])} | {_fmt(r['diff'])} "
                                     f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] | {r['test']} | {_fmt(r['p_value'])} | "
                                     f"{r['ordering']} |")
    lines += ["", "All metrics, steps and layers: `study.csv`" + (" and `contrasts.csv`." if contrasts else "."), ""]
    path.write_text("\n".join(lines))
    return path


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", name)


def write_curves(folder: Path, summary: pd.DataFrame, per_seed: pd.DataFrame, metrics: Sequence[str],
                 layers: Sequence[str]) -> list[Path]:
    """One PNG per metric x layer: per group the mean over seeds with its CI band, each seed faintly behind."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in metrics:
        for layer in layers:
            sub = summary[(summary["metric"] == metric) & (summary["layer"] == layer) & (summary["step"] >= 0)]
            if sub["step"].nunique() < 2:
                continue
            fig = Figure(figsize=(6.4, 4.0), dpi=110)
            FigureCanvasAgg(fig)
            ax = fig.add_subplot()
            for i, (group, g) in enumerate(sub.groupby("group", sort=True)):
                color = f"C{i % 10}"
                raw = per_seed[(per_seed["group"] == group) & (per_seed["metric"] == metric) & (per_seed["layer"] == layer)]
                for _, seed_rows in raw.groupby("seed"):
                    seed_rows = seed_rows.sort_values("step")
                    ax.plot(seed_rows["step"], seed_rows["value"], color=color, alpha=0.25, lw=0.8)
                g = g.sort_values("step")
                ax.plot(g["step"], g["mean"], color=color, lw=2, label=f"{group} (n={int(g['n'].max())})")
                ax.fill_between(g["step"], g["ci_low"], g["ci_high"], color=color, alpha=0.18, lw=0)
            ax.set(xlabel="step", ylabel=metric, title=f"{metric} — {layer} (mean, 95% t CI, seeds faint)")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            out = folder / f"{_safe(metric)}__{_safe(layer)}.png"
            fig.tight_layout()
            fig.savefig(out)
            written.append(out)
    return written
