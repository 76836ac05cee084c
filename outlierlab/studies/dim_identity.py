"""Which dimension carries each layer's concentration, since when, and in how many layers (Kovaleva et al. 2021).

    python -m outlierlab.studies.dim_identity docs/order_use/cells_schemes_large.parquet docs/order_use/cells_large_mlm.parquet \
        --out docs/order_use/dim_identity_large

Kovaleva et al. (2021, "BERT Busters") found BERT's outlier dimensions early, at the *same index in every layer* (308
and 381 in BERT-base), and kept.  The study aggregator averages *how concentrated* a layer is; this job gives, per
finished cell and layer, ``metrics.layer_identity.layer_identity`` (dimension and share at the last record,
``held_since``, ``held_fraction``, ``layers_sharing``) with the cell's group (identity overrides that differ, as the
aggregator names groups), folder, data set, objective, scheme and seed.

Indices are arbitrary between seeds: identity is compared within a cell.  Chance: two unrelated layers' dimensions
coincide with probability 1/d, and a layer without concentration has a share near 1/d.  Descriptive, no test: the
summary gives per group and layer the median ``held_fraction``, the mean share, the seeds ending on the previous layer's
dimension, the median ``layers_sharing`` and the seeds whose dimension settled in the interval in which they began to
use order (``use_from``).  ``--until STEP`` as the aggregator's.  One run's history: ``ol.dim_identity``.

Writes ``<out>/dim_identity.csv`` (a row per cell and layer) and ``<out>/dim_identity.md`` (the summary).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from outlierlab.metrics.layer_identity import HISTORY, layer_identity
from outlierlab.studies.cells import Cell, find_cells
from outlierlab.utils.atomic import write_atomic
from outlierlab.utils.tables import md_table, read_metrics

STATISTICS = ("abs_argmax_share", "argmax_share", "argmin_share")  # the monitor rows that carry a dimension


def _group(cell: Cell) -> dict[str, str]:
    return {"folder": cell.path.parent.name, "data": cell.overrides.get("data", "default"),
            "objective": str(cell.config.get("objective", "mlm")),
            "pos": str(cell.config.get("pos.name", cell.overrides.get("pos", "?")))}


def use_from(cell: Cell, until: int | None = None) -> dict[str, float]:
    """The validation at which the cell's order use (``val/order_use``, nats) first reached the run's
    ``order_use_threshold`` (``use_from``) and the one before (``use_before``, 0 if first), in optimizer steps: a layer
    settled as the model began to use order when ``use_before < held_since <= use_from``.  NaN where not measured or
    never reached."""
    nan = {"use_before": float("nan"), "use_from": float("nan")}
    m = read_metrics(cell.path / "csv" / "metrics.csv")  # at the monitors' step of the same point
    if "val/order_use" not in m:
        return nan
    v = m.dropna(subset=["val/order_use"])[["step", "val/order_use"]]
    v = v[v["step"] <= until] if until is not None else v
    threshold = cell.config.get("order_use_threshold")
    above = v[v["val/order_use"] >= (0.1 if threshold is None else float(threshold))]
    if above.empty:
        return nan
    first = int(above["step"].iloc[0])
    earlier = v.loc[v["step"] < first, "step"]
    return {"use_before": int(earlier.iloc[-1]) if len(earlier) else 0, "use_from": first}


def collect(paths: list[str | Path], statistic: str = "abs_argmax_share", until: int | None = None
            ) -> tuple[pd.DataFrame, list[str]]:
    """Every finished cell's ``layer_identity`` with its group, folder, data set, objective, scheme, seed and
    ``use_from``, and one line per cell left out; ``until``: histories up to that step, cells stopped after it admitted.
    """
    found, skipped = [], []
    for cell in find_cells(paths, until):
        history = cell.path / HISTORY
        if not cell.usable or not history.is_file():
            skipped.append(f"{cell.path}: " + ("; ".join(cell.problems) or "not finished" if not cell.usable
                                                 else f"no {HISTORY}"))
            continue
        rows = pd.read_csv(history)
        t = layer_identity(rows if until is None else rows[rows["step"] <= until], statistic)
        found.append((cell, t.assign(seed=cell.seed, **use_from(cell, until))))
    if not found:
        raise ValueError(f"no finished cell with {HISTORY} under {', '.join(map(str, paths))}")
    # a group is every identity override that differs between the cells (the seed aside), as the study aggregator
    # groups them: cells of one group in several folders pool, cells differing in arch= (say) do not
    keys = sorted({k for c, _ in found for k in c.overrides})
    varying = [k for k in keys if len({c.overrides.get(k) for c, _ in found}) > 1]
    tables = []
    for cell, t in found:
        label = ",".join(f"{k}={cell.overrides.get(k, '-')}" for k in varying) or "all"
        columns = {"group": label, **_group(cell)}
        tables.append(t.assign(**columns)[[*columns, "seed", *[c for c in t.columns if c != "seed"]]])
    return pd.concat(tables, ignore_index=True), skipped


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per group (one group's cells in several folders pooled) and layer: seeds, median ``held_fraction``, mean share,
    seeds ending on the previous layer's dimension, median ``layers_sharing``, and of the seeds that came to use order
    (``use_measured``) those that settled the dimension in that interval (``with_use``, ``use_from``)."""
    t = table.sort_values(["group", "folder", "seed", "layer"]).copy()
    previous = t.groupby(["group", "folder", "seed"])["dim"].shift()
    t["as_previous"] = t["dim"].eq(previous) & t["layer"].gt(0)
    t["with_use"] = (t["use_before"] < t["held_since"]) & (t["held_since"] <= t["use_from"])  # NaN: False
    return (t.groupby(["group", "data", "objective", "pos", "layer"], sort=True)
            .agg(seeds=("seed", "size"), held_fraction=("held_fraction", "median"), share=("share", "mean"),
                 as_previous=("as_previous", "sum"), layers_sharing=("layers_sharing", "median"),
                 with_use=("with_use", "sum"), use_measured=("use_from", "count"))
            .reset_index())


def markdown(summ: pd.DataFrame, statistic: str, skipped: list[str]) -> str:
    lines = [f"# Which dimension, since when (`{statistic}`, `outlierlab.studies.dim_identity`)", "",
             "held = median over seeds of 1 − (first step of the final dimension's unbroken run) / last step; "
             "as previous = seeds whose layer ends on the previous layer's dimension (chance 1/d); layers on its dim = "
             "median number of layers ending on the layer's dimension (itself included); settled with use = seeds whose "
             "layer's dimension settled in the validation interval in which order use first reached the threshold, "
             "of the seeds where it did.", ""]
    rows = [[r.group, r.layer, r.seeds, r.held_fraction, r.share,
             "–" if r.layer == 0 else f"{r.as_previous}/{r.seeds}", f"{r.layers_sharing:g}",
             f"{r.with_use}/{r.use_measured}" if r.use_measured else "–"] for r in summ.itertuples()]
    lines += [md_table(["group", "layer", "seeds", "held", "share", "as previous", "layers on its dim",
                        "settled with use"], rows, digits=2), ""]
    if skipped:
        lines += ["Left out: " + "; ".join(skipped), ""]
    return "\n".join(lines)


def _loop_history(path: Path) -> Path | None:
    """The monitor history of a loop monitor's folder -- ``ol.OutlierMonitor``'s ``out_dir``, a transformers
    ``Trainer``'s ``output_dir`` (its ``monitor/``) -- or a ``hidden_states.csv`` itself; None for anything else
    (train.py cells and sweeps go through ``collect``)."""
    from outlierlab.studies.table import is_cell

    if path.is_file() and path.suffix == ".csv":
        return path
    if not path.is_dir() or is_cell(path):
        return None
    for candidate in (path / "hidden_states.csv", path / "monitor" / "hidden_states.csv"):
        if candidate.is_file():
            return candidate
    return None


def _write_loop_histories(histories: dict, statistic: str, out: Path) -> int:
    """Per layer, each history's dimension (``ol.dim_identity``'s table, a ``history`` column first)."""
    from outlierlab.metrics.layer_identity import layer_identity
    from outlierlab.monitoring.history import history_frame

    frames = []
    for name, path in histories.items():
        frame = history_frame(path).astype({"dim": "float64"})  # complete rows only; NaN where no dim
        frames.append(layer_identity(frame, statistic).assign(history=name))
    table = pd.concat(frames, ignore_index=True)
    table = table[["history", *[c for c in table.columns if c != "history"]]]
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "dim_identity.csv", table.to_csv(index=False, float_format="%.6g"))
    write_atomic(out / "dim_identity.md", f"# Dimension identity ({statistic})\n\n"
                 + md_table(list(table.columns), table.itertuples(index=False)) + "\n")
    print(f"dim_identity: {len(table)} layers from {len(histories)} monitor histories -> {out}/dim_identity.csv")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m outlierlab.studies.dim_identity", description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="folders of cells (a sweep or exported cells), or cells")
    ap.add_argument("--out", required=True, help="where dim_identity.csv and dim_identity.md go")
    ap.add_argument("--statistic", default="abs_argmax_share", choices=STATISTICS,
                    help="whose dimension: the |x| argmax (default), the signed argmax or the argmin (Luo et al. 2021)")
    ap.add_argument("--until", type=int, help="read the histories up to this step; admit cells stopped after it")
    args = ap.parse_args(argv)
    histories = {f: _loop_history(Path(f)) for f in args.folders}
    if any(histories.values()):
        if not all(histories.values()):
            print("dim_identity: give either folders of train.py cells or monitor histories (a loop monitor's "
                  "out_dir, a Trainer's output_dir, a hidden_states.csv), not both in one call", file=sys.stderr)
            return 2
        return _write_loop_histories(histories, args.statistic, Path(args.out))
    try:
        table, skipped = collect(args.folders, args.statistic, args.until)
    except (FileNotFoundError, ValueError) as e:
        print(f"dim_identity: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # atomically, as every study output: a full disk or a kill never leaves a table cut under its own name
    write_atomic(out / "dim_identity.csv", table.to_csv(index=False, float_format="%.6g"))
    write_atomic(out / "dim_identity.md", markdown(summary(table), args.statistic, skipped))
    print(f"dim_identity: {len(table)} rows from {table.groupby(['folder', 'group', 'seed']).ngroups} "
          f"cells -> {out}/dim_identity.csv, dim_identity.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
