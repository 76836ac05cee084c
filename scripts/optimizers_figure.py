"""The optimizer study's figure, from its readings: per cell, the largest |x| argmax share of any layer, the largest
share of one position bucket's tokens that a layer's dominant dimension holds (the high side of the position-marker
rule), and the validation loss, by step, to the last step of the seed-4 AdamW cell; colour by optimizer, the line by
seed.

    python scripts/optimizers_figure.py docs/optimizers

Reads ``readings.csv`` (``scripts/optimizer_study.py``) and ``ladder.csv.xz`` (``python -m outlierlab.studies.ladder``)
in FOLDER and writes ``optimizers.png`` there, a palette PNG (``outlierlab.studies.report.save_palette_png``), as
docs/ keeps its figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

COLOURS = {"adamw": "#08306b", "muon": "#d94801", "sgd": "#238b45", "adamw-eps1e-6": "#6a51a3"}
OTHER_COLOURS = ["#525252", "#a50f15"]
SEED_STYLES = {"4": "-", "3": "--"}  # the seed-4 cells solid, a second seed dashed
MARKER_HIGH = 0.9
SHARE_BOUND = 0.16  # the declared "prevents" rule's bound (docs/optimizers.md)


def figure(folder: Path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    readings = pd.read_csv(folder / "readings.csv")
    long = pd.read_csv(folder / "ladder.csv.xz", dtype={"layer": str})
    fig = Figure(figsize=(12.0, 3.8), dpi=100)
    FigureCanvasAgg(fig)
    share_ax, pos_ax, loss_ax = fig.subplots(1, 3)
    last = int(readings[readings.cell == "4x256_learned_4_adamw"].step.max())  # the seed-4 cells' span
    for i, (cell, rows) in enumerate(readings.groupby("cell", sort=True)):
        seed, optimizer = (cell.split("_") + ["adamw"])[2:4]  # <rung>_<pos>_<seed>[_<optimizer>]: the ladder's are AdamW
        style = dict(color=COLOURS.get(optimizer, OTHER_COLOURS[i % len(OTHER_COLOURS)]), lw=1.4,
                     ls=SEED_STYLES.get(seed, ":"), label=f"{optimizer}, seed {seed}")
        rows = rows[rows.step <= last].sort_values("step")
        share_ax.plot(rows.step, rows.max_share, **style)
        by_pos = long[(long.cell == cell) & long.metric.str.startswith("abs_argmax_share_pos_") & (long.layer != "0")]
        top = by_pos[by_pos.step <= last].groupby("step").value.max()
        pos_ax.plot(top.index, top.values, **style)
        loss = rows.dropna(subset=["val_loss"])
        loss_ax.plot(loss.step, loss.val_loss, **style)
    share_ax.axhline(SHARE_BOUND, color="#999999", ls=":", lw=1)
    share_ax.set(xlabel="step", ylabel="largest |x| argmax share of any layer", ylim=(0, 1.0),
                 title="concentration on one dimension")
    pos_ax.axhline(MARKER_HIGH, color="#999999", ls="--", lw=1)
    pos_ax.set(xlabel="step", ylabel="largest share of one position bucket", ylim=(0, 1.05),
               title="position marking (rule: 0.9)")
    loss_ax.set(xlabel="step", ylabel="validation loss (nats)", title="validation loss")
    for ax in (share_ax, pos_ax, loss_ax):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/optimizers_figure.py", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="holds readings.csv and ladder.csv.xz")
    args = parser.parse_args(argv)
    missing = [n for n in ("readings.csv", "ladder.csv.xz") if not (args.folder / n).is_file()]
    if missing:
        parser.error(f"{args.folder} lacks {', '.join(missing)}: make them with the commands in docs/optimizers.md")
    from outlierlab.studies.report import save_palette_png

    out = args.folder / "optimizers.png"
    save_palette_png(figure(args.folder), out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
