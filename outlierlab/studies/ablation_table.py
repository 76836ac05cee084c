"""Kovaleva et al.'s "random vs outliers" comparison of several evaluate.py runs side by side, as one Markdown table.

    python -m outlierlab.studies.ablation_table docs/gpu/ladder_cpu_ablation.parquet
    python -m outlierlab.studies.ablation_table outputs/evaluate/<date>      # a folder of evaluate.py run dirs

One row per run directory with ``ablation.csv`` (``analyses=[ablation]``) and per set of dims it disabled (the
``outliers`` condition, or the ``user`` one: ``ablation.dims``; with the norms and layers it was zeroed in when not
every layer's output LayerNorm): the intact model's loss, how much zeroing the set's LayerNorm gain and bias raised the
loss and changed top-1 accuracy, what each random draw of as many dims did (mean, smallest, largest), and how many
draws the set's rise exceeds: above all ``n`` is the one-sided rank test of "these dims matter more than random ones"
at p = 1/(n+1).  A ``user`` set of another size than the ``outliers`` one gets no comparison ("–").

``--by-position`` gives the same rise per position bucket of the scored tokens (``ablation_by_position.csv``), each
cell the set's rise and, in brackets, the draws' mean rise and ``k/n``.  Descriptive: across a row's buckets no
correction leaves one significant at 20 draws.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from outlierlab.utils.tables import print_table

HEADER = ["run", "intact loss", "dims zeroed", "Δ loss", "Δ top-1", "random dims: Δ loss mean (min to max)",
          "Δ loss above"]


def ablation_rows(runs: Path) -> list[list[str]]:
    """The table's rows for every run directory under ``runs`` that has ``ablation.csv`` (runs in name order)."""
    if not runs.is_dir():
        raise FileNotFoundError(f"{runs} is not a folder of evaluate.py run directories")
    rows = []
    for run in sorted(p for p in runs.iterdir() if (p / "ablation.csv").is_file()):
        table = pd.read_csv(run / "ablation.csv", dtype={"dims": str, "layers": str, "layernorms": str})
        intact = table[table.condition == "intact"].iloc[0]
        draws = table[table.condition == "random_draw"]
        rises = draws.loss - intact.loss
        for row in table[table.condition.isin(["outliers", "user"])].itertuples():
            rise = row.loss - intact.loss
            comparable = len(draws) > 0 and int(draws.n_dims.iloc[0]) == int(row.n_dims)
            where = _where(row.dims, getattr(row, "layers", None), row.layernorms, getattr(row, "mode", None))
            rows.append([run.name, f"{intact.loss:.3f}", where, f"{rise:+.3f}",
                         f"{row.top1 - intact.top1:+.3f}",
                         f"{rises.mean():+.3f} ({rises.min():+.3f} to {rises.max():+.3f})" if comparable else "–",
                         f"{int((rises < rise).sum())} of {len(rises)}" if comparable else "–"])
    if not rows:
        raise FileNotFoundError(f"no evaluate.py run under {runs} has ablation.csv with disabled dims "
                                "(analyses=[ablation], with LayerNorm outlier dims or ablation.outlier_dims/dims)")
    return rows


def _where(dims: str, layers, layernorms, mode=None) -> str:
    """The dims zeroed, and where when it was not Kovaleva et al.'s every output LayerNorm: the norms
    (``ablation.layernorms``) and the layers (``ablation.layers``; empty: every layer; a run written before the column
    existed has none); ``set to mean`` where they were set to their mean instead (``ablation.mode=mean``; a run
    written before the ``mode`` column existed zeroed them)."""
    where = ["set to mean"] if mode == "mean" else []
    if isinstance(layernorms, str) and layernorms and layernorms != "output":
        where.append(layernorms.replace(";", ", "))
    if isinstance(layers, str) and layers:
        where.append(f"layer{'s' if ';' in layers else ''} {layers.replace(';', ', ')}")
    dims = dims.replace(";", " ")
    return f"{dims} ({'; '.join(where)})" if where else dims


def by_position_rows(runs: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the ``--by-position`` table for every run directory under ``runs`` that has
    ``ablation_by_position.csv`` (runs in name order)."""
    if not runs.is_dir():
        raise FileNotFoundError(f"{runs} is not a folder of evaluate.py run directories")
    frames = [(run.name, pd.read_csv(run / "ablation_by_position.csv", dtype={"dims": str, "positions": str}))
              for run in sorted(runs.iterdir()) if (run / "ablation_by_position.csv").is_file()]
    buckets = (pd.concat([f for _, f in frames])[["first_position", "positions"]].drop_duplicates()
               .sort_values("first_position").positions.tolist()) if frames else []
    rows = []
    for name, table in frames:
        loss = {c: part.set_index("positions").loss for c, part in table.groupby("condition")}
        draws = table[table.condition == "random_draw"]
        draw_size = draws.dims.iloc[0].count(";") + 1 if len(draws) else None
        draw_rises = {b: part.loss.to_numpy() - loss["intact"][b] for b, part in draws.groupby("positions")}
        for condition, dims in (table[table.condition.isin(["outliers", "user"])][["condition", "dims"]]
                                .drop_duplicates().itertuples(index=False)):
            comparable = draw_size == dims.count(";") + 1  # draws of as many dims, as in the overall table
            cells = []
            for b in buckets:
                if b not in loss["intact"]:
                    cells.append("–")
                    continue
                rise = loss[condition][b] - loss["intact"][b]
                if comparable and b in draw_rises:
                    r = draw_rises[b]
                    cells.append(f"{rise:+.3f} ({r.mean():+.3f}, {int((r < rise).sum())}/{len(r)})")
                else:
                    cells.append(f"{rise:+.3f}")
            rows.append([name, dims.replace(";", " "), *cells])
    if not rows:
        raise FileNotFoundError(f"no evaluate.py run under {runs} has ablation_by_position.csv with disabled dims "
                                "(analyses=[ablation])")
    return ["run", "dims zeroed", *(f"pos. {b}" for b in buckets)], rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", help="a folder of evaluate.py run directories, or a study table (.parquet) of them")
    ap.add_argument("--by-position", action="store_true",
                    help="the rise per position bucket of the scored tokens (random draws' mean and rank in brackets)")
    args = ap.parse_args(argv)
    from outlierlab.studies.table import resolve

    runs = resolve(args.runs)
    return print_table(lambda: by_position_rows(runs) if args.by_position else (HEADER, ablation_rows(runs)))


if __name__ == "__main__":
    sys.exit(main())
