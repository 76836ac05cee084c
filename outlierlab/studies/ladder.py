"""The scale ladder's table: every cell's curves in one long CSV, and where a Luo-type dimension first appears.

    python -m outlierlab.studies.ladder multirun/scale_ladder [more dirs] --out docs/gpu/ladder.csv
    python -m outlierlab.studies.ladder multirun/scale_ladder --out strict.csv --share 0.9 --layer-fraction 0.75
    python -m outlierlab.studies.ladder docs/gpu/ladder_cpu.parquet --out docs/gpu/ladder_cpu.csv.xz --markdown docs/gpu/ladder_cpu.md

Reads each train.py cell (``config.yaml``, ``csv/metrics.csv``, ``monitor/hidden_states.csv``/``layernorm.csv``) under
the given folders or packed studies and writes ``--out`` (long: ``COLUMNS``; ``val/loss``, ``val/order_use``,
``layernorm/n_outlier_dims`` and per encoder layer ``PER_LAYER`` and ``abs_argmax_share_pos_<bucket>``; ``tokens`` =
step x batch x block x accumulation x devices) and ``<out stem>_summary.csv``: per cell the first step with a Luo-type
dimension (``metrics.luo_dimension``) and how lasting and strong it is (``luo_kept``, ``luo_final_*``, ``max_share``,
``final_position_shares``), the first LayerNorm outlier, the final and best validation loss, and, to order the two
events, the first step with order use ≥ ``ORDER_USE_THRESHOLD`` (``order_use_step``) and the first at which a layer's
dimension is a position marker (``marker_*``: ≥ ``MARKER_HIGH`` of one bucket's tokens and ≤ ``MARKER_LOW`` of
another's; rule fixed before any cell was read).  docs/gpu.md defines every column.
"""

from __future__ import annotations

import argparse
import lzma
import math
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from omegaconf import OmegaConf

from outlierlab.metrics.luo_dimension import LAYER_FRACTION, SHARE, luo_by_step
from outlierlab.metrics.word_order import ORDER_USE_THRESHOLD
from outlierlab.monitoring.history import history_frame
from outlierlab.utils.atomic import write_atomic
from outlierlab.utils.tables import md_table, read_metrics

COLUMNS = ["cell", "rung", "layers", "hidden", "objective", "pos", "seed", "step", "tokens", "metric", "layer", "value"]
PER_LAYER = ("abs_argmax_share", "abs_argmax_dim", "kurtosis", "max_median")
#: The monitors' by-position rows (outlierlab.metrics.monitor_records.hidden_state_records): ``<prefix><bucket>``.
POSITION_PREFIX = "abs_argmax_share_pos_"
#: A layer's dominant dimension is a position marker when it holds >= MARKER_HIGH of one bucket's tokens and
#: <= MARKER_LOW of another's: nearly all of some positions and nearly none of others. (The monitors' default texts,
#: 32 held-out *Persuasion* sentences, put 32 to 433 tokens in each bucket from position 1 to 64-127 under the
#: RoBERTa tokenizer, so neither bound is met by a handful of tokens.)
MARKER_HIGH, MARKER_LOW = 0.9, 0.1


def find_cells(paths: Sequence[str | Path]) -> list[Path]:
    """Every train.py run directory under ``paths`` (a folder holding ``config.yaml`` and ``monitor/``); a packed
    study (``docs/order_use/cells_schemes_large_cut.parquet``, ``outlierlab.studies.table``) reads as the folder
    it was packed from (and ``<table>.parquet/<cell>`` as that cell), so a committed 4 x 128 study sits in the same
    table as the ladder's rungs."""
    from outlierlab.studies.table import resolve

    cells = []
    for given in paths:
        p = resolve(given)  # also one cell of a packed study: docs/gpu/ladder_cpu.parquet/4x256_learned_3
        if not p.exists():
            raise FileNotFoundError(f"{given} does not exist")
        cells += sorted(c.parent for c in p.rglob("config.yaml") if (c.parent / "monitor").is_dir())
    if not cells:
        raise ValueError(f"no train.py run directory (config.yaml + monitor/) under {', '.join(map(str, paths))}")
    return cells


def _cell_rows(cell: Path, share: float = SHARE, layer_fraction: float = LAYER_FRACTION) -> tuple[pd.DataFrame, dict]:
    cfg = OmegaConf.load(cell / "config.yaml")
    layers, hidden = int(cfg.model.num_layers), int(cfg.model.hidden_size)
    per_step = (int(cfg.data.batch_size) * int(cfg.data.block_size) * int(cfg.trainer.get("accumulate_grad_batches")
                or 1) * int(cfg.trainer.get("devices") if str(cfg.trainer.get("devices")).isdigit() else 1))
    ident = {"cell": cell.name, "rung": f"{layers}x{hidden}", "layers": layers, "hidden": hidden,
             "objective": str(cfg.get("objective") or "mlm"), "pos": str(cfg.pos.name), "seed": int(cfg.seed)}
    hs = history_frame(cell / "monitor" / "hidden_states.csv")
    hs = hs[hs["name"].str.fullmatch(r"layer_\d+")].copy()
    hs["layer"] = hs["name"].str.removeprefix("layer_").astype(int)
    hs = hs[hs["layer"] >= 1]  # encoder layers; layer_0 is the embedding output
    enc = hs[hs["statistic"].isin(PER_LAYER)]
    dims = enc[enc["statistic"] == "abs_argmax_share"]
    by_pos = hs[hs["statistic"].str.startswith(POSITION_PREFIX)]
    cols = ["step", "metric", "layer", "value"]
    parts = [by_pos.assign(metric=by_pos["statistic"])[cols], enc.assign(metric=enc["statistic"])[cols],
             dims.assign(metric="abs_argmax_dim", value=dims["dim"].astype(float))[cols]]
    ln_path = cell / "monitor" / "layernorm.csv"
    ln = history_frame(ln_path, ["n_outlier_dims"]) if ln_path.is_file() else pd.DataFrame(columns=["step", "value"])
    parts.append(pd.DataFrame({"step": ln["step"], "metric": "layernorm/n_outlier_dims", "layer": "model",
                               "value": ln["value"]}))
    metrics = read_metrics(cell / "csv" / "metrics.csv")
    for m in ("val/loss", "val/order_use"):
        if m in metrics:
            v = metrics[["step", m]].dropna()
            parts.append(pd.DataFrame({"step": v["step"].astype(int), "metric": m, "layer": "model", "value": v[m]}))
    rows = pd.concat(parts, ignore_index=True)
    rows["tokens"] = rows["step"].astype(int) * per_step
    rows = rows.assign(**ident)
    by_step = luo_by_step(zip(dims["step"], dims["layer"], dims["dim"], dims["value"]), layers, share, layer_fraction)
    first = next((step for step, found in by_step.items() if found is not None), None)
    luo = (first, *by_step[first][:2]) if first is not None else None
    since = [found is not None for step, found in by_step.items() if first is not None and step >= first]
    final = by_step[max(by_step)] if by_step else None
    ln_first = ln[ln["value"] > 0]["step"].min() if len(ln) else math.nan
    val = rows[rows["metric"] == "val/loss"].sort_values("step")
    last = int(rows["step"].max())
    summary = {**ident, "last_step": last, "tokens": last * per_step,
               "luo_step": luo[0] if luo else math.nan, "luo_tokens": luo[0] * per_step if luo else math.nan,
               "luo_dim": luo[1] if luo else math.nan, "luo_layers": luo[2] if luo else math.nan,
               "luo_kept": sum(since) / len(since) if since else math.nan,
               "luo_final_dim": final[0] if final else math.nan, "luo_final_layers": final[1] if final else 0,
               "luo_final_share": final[2] if final else math.nan,
               "max_share": float(dims["value"].max()) if len(dims) else math.nan,
               "final_position_shares": _final_position_shares(dims, by_pos),
               "ln_outlier_step": ln_first,
               "order_use_step": _first_step(rows[(rows["metric"] == "val/order_use")
                                                 & (rows["value"] >= ORDER_USE_THRESHOLD)]),
               **_first_marker(by_pos),
               "val_loss_final": float(val["value"].iloc[-1]) if len(val) else math.nan,
               "val_loss_best": float(val["value"].min()) if len(val) else math.nan}
    return rows[COLUMNS], summary


def _first_step(rows: pd.DataFrame) -> float:
    return int(rows["step"].min()) if len(rows) else math.nan


def _first_marker(by_pos: pd.DataFrame) -> dict:
    """The first step and encoder layer whose dominant dimension is a position marker (``MARKER_HIGH``,
    ``MARKER_LOW``), with its dim and the buckets it holds; NaN/"" where none is (or none was recorded)."""
    found = {"marker_step": math.nan, "marker_layer": math.nan, "marker_dim": math.nan, "marker_buckets": ""}
    for (step, layer), part in by_pos.groupby(["step", "layer"], sort=True):
        high = part[part["value"] >= MARKER_HIGH]["statistic"].str.removeprefix(POSITION_PREFIX)
        if len(high) and (part["value"] <= MARKER_LOW).any():
            buckets = sorted(high, key=lambda b: int(b.split("-")[0]))
            dim = part["dim"].iloc[0]
            return {"marker_step": int(step), "marker_layer": int(layer), "marker_dim": math.nan if pd.isna(dim) else int(dim),
                    "marker_buckets": " ".join(buckets)}
    return found


def _final_position_shares(dims: pd.DataFrame, by_pos: pd.DataFrame) -> str:
    """At the last step: the most concentrated encoder layer's dimension, its share per position bucket
    (``"1:1.00 2-3:0.98 ..."``, buckets in order), or "" where the monitors did not record them."""
    if not len(dims) or not len(by_pos):
        return ""
    last = dims[dims["step"] == dims["step"].max()]
    layer = int(last.loc[last["value"].idxmax(), "layer"])
    rows = by_pos[(by_pos["step"] == last["step"].iloc[0]) & (by_pos["layer"] == layer)].copy()
    rows["bucket"] = rows["statistic"].str.removeprefix(POSITION_PREFIX)
    rows = rows.assign(first=rows["bucket"].str.split("-").str[0].astype(int)).sort_values("first")
    return " ".join(f"{b}:{v:.2f}" for b, v in zip(rows["bucket"], rows["value"]))


def ladder_tables(paths: Sequence[str | Path], share: float = SHARE, layer_fraction: float = LAYER_FRACTION
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The long table and the per-cell summary (module docstring); ``share`` and ``layer_fraction`` set the
    Luo-type definition (``outlierlab.metrics.luo_dimension.luo_dimension``; 0.5 and 0.5: its weakest form)."""
    if not (0 < share <= 1 and 0 < layer_fraction <= 1):
        raise ValueError(f"--share and --layer-fraction must be in (0, 1], got {share} and {layer_fraction}")
    long, summary = [], []
    for cell in find_cells(paths):
        rows, s = _cell_rows(cell, share, layer_fraction)
        long.append(rows)
        summary.append(s)
    order = ["layers", "hidden", "objective", "pos", "seed", "cell", "step", "metric", "layer"]
    table = pd.concat(long, ignore_index=True)
    table["layer"] = table["layer"].astype(str)
    return (table.sort_values(order, kind="stable").reset_index(drop=True),
            pd.DataFrame(summary).sort_values(["layers", "hidden", "objective", "pos", "seed", "cell"])
            .reset_index(drop=True))


def trajectories_markdown(table: pd.DataFrame, summary: pd.DataFrame, steps: Sequence[int] | None = None) -> str:
    """One Markdown table per cell: at each validated step (or ``steps``) the validation loss, order use and every
    encoder layer's largest |x| argmax share with its dimension; under it the cell's two events from ``summary``
    (``order_use_step``, ``marker_*``). The docs' per-step tables are this text, regenerated from the packed cells."""
    out = []
    for _, cell in summary.iterrows():
        rows = table[table["cell"] == cell["cell"]]  # two cells may share rung, pos and seed (replicates)
        wide = rows.pivot_table(index="step", columns=["metric", "layer"], values="value", aggfunc="last")
        at = sorted(int(s) for s in (steps if steps is not None else
                                     rows[rows["metric"] == "val/loss"]["step"].unique()) if s in wide.index)
        layers = sorted({int(l) for m, l in wide.columns if m == "abs_argmax_share"})
        head = ["step", "val loss", "order use (nats)", *(f"layer {l}: share (dim)" for l in layers)]
        body = []
        for step in at:
            row = wide.loc[step]

            def get(metric, layer="model"):
                v = row.get((metric, str(layer)), math.nan)
                return math.nan if v is None else float(v)

            body.append([f"{step:,}", f"{get('val/loss'):.3f}", f"{get('val/order_use'):.2f}",
                         *(f"{get('abs_argmax_share', l):.2f} ({get('abs_argmax_dim', l):.0f})" for l in layers)])
        title = (f"{cell['rung']} {cell['objective']} pos={cell['pos']} seed {cell['seed']} (cell {cell['cell']}, "
                 f"last step {cell['last_step']:,})")
        recorded_order = (rows["metric"] == "val/order_use").any()
        recorded_marker = rows["metric"].str.startswith(POSITION_PREFIX).any()
        events = (f"Order use >= {ORDER_USE_THRESHOLD:g} nats: {_event(cell['order_use_step'], recorded_order)}. "
                  f"A position marker (a layer's dominant dimension holding >= {MARKER_HIGH:g} of one position "
                  f"bucket's tokens and <= {MARKER_LOW:g} of another's): {_event(cell['marker_step'], recorded_marker)}"
                  + (f" (layer {cell['marker_layer']:.0f}, dim {cell['marker_dim']:.0f}, buckets {cell['marker_buckets']})"
                     if cell["marker_buckets"] else "") + ".")
        out += [f"### {title}", "", md_table(head, body, cell=str), "", events, ""]
    return "\n".join(out)


def _event(step: Any, recorded: bool) -> str:
    if step == step:  # not NaN
        return f"from step {int(step):,}"
    return "not reached" if recorded else "not recorded"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m outlierlab.studies.ladder", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="folders holding the ladder's train.py cells")
    parser.add_argument("--out", required=True, help="the long CSV, .csv or .csv.xz (its _summary.csv goes beside it)")
    parser.add_argument("--share", type=float, default=SHARE,
                        help="a Luo-type dimension holds at least this share of the tokens' |x| argmax (default 0.5)")
    parser.add_argument("--layer-fraction", type=float, default=LAYER_FRACTION,
                        help="... in at least this fraction of the encoder layers (default 0.5; Luo et al.'s "
                             "RoBERTa-base dimension: nearly all)")
    parser.add_argument("--markdown", default=None,
                        help="also write each cell's per-step table (loss, order use, every layer's largest share) "
                             "and its first order use and position marker, as Markdown, to this file")
    args = parser.parse_args(argv)
    try:
        table, summary = ladder_tables(args.paths, args.share, args.layer_fraction)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # atomically, as every study output: a full disk or a kill never leaves a table cut under its own name
    long = table.to_csv(index=False, float_format="%.6g").encode()
    # --out x.csv.xz: the long table xz-compressed (pandas reads it as it is), the summary beside it as x_summary.csv
    write_atomic(out, lzma.compress(long) if out.suffix == ".xz" else long)
    stem = out.name.removesuffix(".xz").removesuffix(".csv")
    write_atomic(out.with_name(stem + "_summary.csv"), summary.to_csv(index=False, float_format="%.6g"))
    if args.markdown:
        write_atomic(Path(args.markdown), trajectories_markdown(table, summary))
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
