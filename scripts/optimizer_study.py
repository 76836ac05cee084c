"""The optimizer study's readings (docs/optimizers.md), from its committed tables.

    python scripts/optimizer_study.py docs/optimizers --reference 4x256_learned_4_adamw

Reads, in FOLDER, ``ladder.csv.xz`` and ``ladder_summary.csv`` (made by the ladder module,
``outlierlab.studies.ladder``) and ``cells.parquet`` (the cells packed by ``outlierlab.studies.table``: each cell's
monitor history, for its live W8A8 rows),
and writes ``readings.csv``: per cell and monitored step the validation loss, order use, the largest |x| argmax share
over the layers (its layer and dimension), the largest kurtosis over the layers, and the live W8A8 cost on the
monitor's fixed masked problem (``w8a8_loss_delta``, ``w8a8_keep_loss_delta``: nats; ``w8a8_kl``). Then prints the
declared readings: each cell's first step at or below the reference's validation loss at the steps given by ``--at``
(matched loss; default 950, the AdamW cell's marker onset, and 1,000), its position marker and Luo-type dimension (first step, from the summary), and
whether it meets the declared "prevents" rule (no marker and no layer above ``--share-bound`` at every monitored step
up to the matched loss).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import pandas as pd

W8A8 = ["w8a8_loss_delta", "w8a8_kl", "w8a8_keep_loss_delta", "w8a8_keep_kl"]


def live_w8a8(cells: pd.DataFrame) -> pd.DataFrame:
    """The hidden-state monitor's W8A8 rows of every packed cell: ``cell, step, <W8A8 columns>``."""
    frames = []
    for cell, text in cells[cells["file"] == "monitor/hidden_states.csv"][["cell", "text"]].itertuples(index=False):
        h = pd.read_csv(io.StringIO(text))
        h = h[(h["name"] == "model") & h["statistic"].isin(W8A8)]
        if not h.empty:
            frames.append(h.pivot_table(index="step", columns="statistic", values="value").reset_index()
                          .assign(cell=cell))
    cols = ["cell", "step", *W8A8]
    return pd.concat(frames, ignore_index=True).reindex(columns=cols) if frames else pd.DataFrame(columns=cols)


def readings(long: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """One row per cell and monitored step (see the module's docstring)."""
    by_layer = long[long["layer"].astype(str).str.fullmatch(r"[1-9]\d*")]
    share = by_layer[by_layer["metric"] == "abs_argmax_share"]
    dims = by_layer[by_layer["metric"] == "abs_argmax_dim"].set_index(["cell", "step", "layer"])["value"]
    top = share.loc[share.groupby(["cell", "step"])["value"].idxmax()]
    top = top.assign(max_share_dim=[dims.get((c, s, l)) for c, s, l in zip(top["cell"], top["step"], top["layer"])])
    top = top.rename(columns={"value": "max_share", "layer": "max_share_layer"})[
        ["cell", "step", "max_share", "max_share_layer", "max_share_dim"]]
    kurt = (by_layer[by_layer["metric"] == "kurtosis"].groupby(["cell", "step"])["value"].max()
            .rename("max_kurtosis").reset_index())
    model = long[long["metric"].isin(["val/loss", "val/order_use"])].pivot_table(
        index=["cell", "step"], columns="metric", values="value").reset_index().rename(
        columns={"val/loss": "val_loss", "val/order_use": "order_use"})
    out = top.merge(kurt, on=["cell", "step"], how="outer").merge(model, on=["cell", "step"], how="outer")
    out = out.merge(live_w8a8(cells), on=["cell", "step"], how="left")
    return out.sort_values(["cell", "step"]).reset_index(drop=True)


def matched_step(table: pd.DataFrame, cell: str, loss: float) -> int | None:
    """The first step at which ``cell``'s validation loss is at or below ``loss`` (None: never in its steps)."""
    rows = table[(table["cell"] == cell) & (table["val_loss"] <= loss)]
    return int(rows["step"].min()) if len(rows) else None


def report(table: pd.DataFrame, summary: pd.DataFrame, reference: str, at: list[int], share_bound: float) -> list[str]:
    ref_rows = table[table["cell"] == reference].set_index("step")
    targets = {step: float(ref_rows.loc[step, "val_loss"]) for step in at if step in ref_rows.index}
    lines = [f"{reference}'s validation loss at step {step}: {loss:.3f}" for step, loss in targets.items()]
    lines += [f"{reference} has no validation at step {step}: no matched-loss reading there" for step in at
              if step not in targets]
    for cell, s in summary.set_index("cell").iterrows():
        rows = table[table["cell"] == cell]
        top = rows.loc[rows["max_share"].idxmax()]
        lines.append(f"{cell}: last step {int(s['last_step'])}, val loss {s['val_loss_final']:.3f}; position marker "
                     + (f"from step {int(s['marker_step'])} (layer {int(s['marker_layer'])}, dim {int(s['marker_dim'])})"
                        if pd.notna(s["marker_step"]) else "none")
                     + "; Luo-type dimension " + (f"from step {int(s['luo_step'])}" if pd.notna(s["luo_step"]) else "none")
                     + f"; largest share {top['max_share']:.2f} (layer {int(top['max_share_layer'])}, dim "
                       f"{int(top['max_share_dim'])}, step {int(top['step'])})")
        for ref_step, loss in targets.items():
            step = matched_step(table, cell, loss)
            what = f"{reference}'s loss at step {ref_step} ({loss:.3f})"
            if step is None:
                lines.append(f"  never at or below {what}: reported at equal steps only")
                continue
            upto = rows[rows["step"] <= step]
            marker = pd.notna(s["marker_step"]) and int(s["marker_step"]) <= step
            above = upto[upto["max_share"] > share_bound]
            lines.append(f"  at or below {what} from step {step}: a position marker by then: {'yes' if marker else 'no'}; "
                         f"steps up to it with a layer above {share_bound}: "
                         + (", ".join(str(int(x)) for x in above["step"]) if len(above) else "none")
                         + (" -> meets the 'prevents' rule" if cell != reference and not marker and above.empty else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="holds ladder.csv.xz, ladder_summary.csv and cells.parquet")
    p.add_argument("--reference", required=True, help="the AdamW cell the others are read against")
    p.add_argument("--at", nargs="+", type=int, default=[950, 1000],
                   help="the reference's steps whose validation loss the others are matched to (default 950 1000)")
    p.add_argument("--share-bound", type=float, default=0.16,
                   help="the largest share a layer may reach for 'prevents' (default 0.16)")
    a = p.parse_args(argv)
    need = [a.folder / n for n in ("ladder.csv.xz", "ladder_summary.csv", "cells.parquet")]
    missing = [str(n) for n in need if not n.is_file()]
    if missing:
        p.error(f"missing {', '.join(missing)}: make them with the commands in docs/optimizers.md")
    long, summary, cells = pd.read_csv(need[0]), pd.read_csv(need[1]), pd.read_parquet(need[2])
    if a.reference not in set(summary["cell"]):
        p.error(f"--reference {a.reference!r}: not a cell of {need[1]} ({', '.join(summary['cell'])})")
    table = readings(long, cells)
    table.to_csv(a.folder / "readings.csv", index=False, float_format="%.6g")
    print("\n".join(report(table, summary, a.reference, a.at, a.share_bound)))
    print(f"wrote {a.folder / 'readings.csv'} ({len(table)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
