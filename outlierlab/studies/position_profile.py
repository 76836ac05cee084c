"""The |x|-argmax share by position of several evaluate.py runs side by side, as one Markdown table.

    python -m outlierlab.studies.position_profile docs/gpu/ladder_cpu_eval.parquet --layers 1 2
    python -m outlierlab.studies.position_profile outputs/evaluate/<date>      # a folder of evaluate.py run dirs

One row per run directory (a cell of the packed table, ``outlierlab.studies.table``) and layer: the layer's
|x|-argmax dim, its share in each position bucket (``outliers_by_position.csv``, ``outlierlab.metrics.
position_shares``) and over all tokens (``outliers.csv``'s ``abs_argmax_share``). A dimension whose share is 1 in
some buckets and 0 in others is positional, and its share over all tokens follows the lengths of the texts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from outlierlab.utils.tables import print_table


def profile_rows(runs: Path, layers: Sequence[int] | None = None) -> tuple[list[str], list[list]]:
    """Header and rows of the table for every run directory under ``runs`` that has ``outliers_by_position.csv``
    (runs in name order)."""
    if not runs.is_dir():
        raise FileNotFoundError(f"{runs} is not a folder of evaluate.py run directories")
    frames = []
    for run in sorted(p for p in runs.iterdir() if (p / "outliers_by_position.csv").is_file()):
        pos = pd.read_csv(run / "outliers_by_position.csv", dtype={"positions": str})  # "1" stays a label
        overall = pd.read_csv(run / "outliers.csv").query("transform == 'none'").set_index("layer").abs_argmax_share
        frames.append((run.name, pos, overall))
    if not frames:
        raise FileNotFoundError(f"no evaluate.py run with outliers_by_position.csv under {runs} (analyses=[outliers])")
    buckets = (pd.concat([p for _, p, _ in frames])[["first_position", "positions"]].drop_duplicates()
               .sort_values("first_position").positions.tolist())
    rows = []
    for name, pos, overall in frames:
        for layer, part in pos.groupby("layer"):
            if layers and layer not in layers:
                continue
            share = part.set_index("positions").layer_dim_share
            rows.append([name, layer, int(part.layer_dim.iloc[0]),
                         *(f"{share[b]:.2f}" if b in share else "–" for b in buckets), f"{overall[layer]:.3f}"])
    return ["run", "layer", "dim", *(f"pos. {b}" for b in buckets), "all tokens"], rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", help="a folder of evaluate.py run directories, or a study table (.parquet) of them")
    ap.add_argument("--layers", type=int, nargs="*", help="only these layers (default: all)")
    args = ap.parse_args(argv)
    from outlierlab.studies.table import resolve

    runs = resolve(args.runs)
    return print_table(lambda: profile_rows(runs, args.layers))


if __name__ == "__main__":
    sys.exit(main())
