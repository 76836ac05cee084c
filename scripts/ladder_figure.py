"""The CPU ladder's figure, from the ladder's own tables: per 4x256 cell, order use by step, and the largest share of
one position bucket's tokens that a layer's dominant dimension holds (the high side of the position-marker rule).

    python scripts/ladder_figure.py docs/gpu/ladder_cpu.csv.xz docs/gpu/ladder_cpu_rope.csv.xz --out docs/gpu/ladder_cpu.png

Reads the long tables ``python -m outlierlab.studies.ladder`` writes (``cell, pos, seed, step, metric, layer,
value``); cells whose monitors predate the by-position rows have no line in the second panel. Written as a palette
PNG (``outlierlab.studies.report.save_palette_png``), as docs/ keeps its figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

#: One colour family per position scheme, a shade per seed.
COLOURS = {"learned": ["#08306b", "#2171b5", "#6baed6", "#9ecae1"], "none": ["#525252", "#969696"],
           "rope": ["#d94801", "#fd8d3c"]}
MARKER_HIGH = 0.9


def figure(tables: Sequence[str | Path], rung: str = "4x256"):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    frame = pd.concat([pd.read_csv(t, dtype={"layer": str}) for t in tables], ignore_index=True)
    frame = frame[frame.rung == rung]
    fig = Figure(figsize=(10.0, 3.8), dpi=100)
    FigureCanvasAgg(fig)
    use_ax, pos_ax = fig.subplots(1, 2)
    for (pos, seed), cell in frame.groupby(["pos", "seed"], sort=True):
        colour = COLOURS.get(pos, ["#000000"] * 8)[(int(seed) - 1) % len(COLOURS.get(pos, [0]))]
        label = f"{pos}, seed {seed}"
        use = cell[cell.metric == "val/order_use"].sort_values("step")
        use_ax.plot(use.step, use.value, color=colour, label=label, lw=1.4)
        by_pos = cell[cell.metric.str.startswith("abs_argmax_share_pos_") & (cell.layer != "0")]
        if not by_pos.empty:
            top = by_pos.groupby("step").value.max()
            pos_ax.plot(top.index, top.values, color=colour, label=label, lw=1.4)
    use_ax.set(xlabel="step", ylabel="order use (nats of validation loss)", title="order use")
    pos_ax.axhline(MARKER_HIGH, color="#999999", ls="--", lw=1)
    pos_ax.text(0.01, MARKER_HIGH + 0.01, "position-marker rule: at least 0.9 of one bucket", fontsize=7,
                color="#666666", transform=pos_ax.get_yaxis_transform())
    pos_ax.set(xlabel="step", ylabel="largest share of one position bucket", ylim=(0, 1.05),
               title="dominant dimensions by position (monitors)")
    use_ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/ladder_figure.py", description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", help="the ladder's long tables (.csv or .csv.xz)")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--rung", default="4x256")
    args = parser.parse_args(argv)
    from outlierlab.studies.report import save_palette_png

    save_palette_png(figure(args.tables, args.rung), Path(args.out))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
