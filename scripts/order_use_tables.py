"""The tables of docs/order_use.md from the committed cells: ``python scripts/order_use_tables.py``.

Reads every cell's ``csv/metrics.csv`` in the packed sweep ``docs/order_use/sweep.parquet`` (every validation's
loss, accuracy and order use; :mod:`outlierlab.studies.table` unpacks it once into the cache) and writes
``docs/order_use/sweep.csv`` -- one row per cell and validation step -- and, on stdout, the markdown tables: per cell
the first step at which order use reached 0.5 nats, and the loss / order use / accuracy at chosen steps.  The CPU
cells of ``experiment=order_recipe_cpu`` (``docs/order_use/cpu.parquet``) go to ``docs/order_use/cpu.csv`` and one table
of every validation, learned beside none; the position probes' table from ``docs/order_use/probes/``.  The studies'
tables (learned vs none at 3 and 5 seeds, every scheme, and on english_large the causal pair, the masked pair, every
scheme and Haviv's 2 x 2) are generated blocks of
docs/order_use.md: ``python -m lab.doc_tables docs/order_use.md`` writes them from each study folder's
``contrasts.csv.xz``, and the tests check them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from outlierlab.studies.table import cells_dir

ROOT = Path(__file__).resolve().parent.parent / "docs" / "order_use"
TARGET = 0.5  # nats of order use: the recipe's target (docs/order_use.md)


def cell_rows(cell: Path) -> pd.DataFrame:
    m = pd.read_csv(cell / "csv" / "metrics.csv")
    v = m.dropna(subset=["val/loss"])[["step", "val/loss", "val/order_use", "val/acc"]].copy()
    v["step"] = v["step"].astype(int) + 1  # Lightning logs validation at the step index before the increment
    v.insert(0, "cell", cell.name)
    v["finished"] = (cell / "finished.json").exists()
    overrides = (cell / ".hydra" / "overrides.yaml").read_text().splitlines()
    v["overrides"] = " ".join(o[2:] for o in overrides if not o.startswith(("- trainer=", "- threads=", "- paths.", "- callbacks.model_checkpoint")))
    return v


def main() -> int:
    sweep = cells_dir(ROOT / "sweep.parquet")
    cells = sorted(p for p in sweep.iterdir() if (p / "csv" / "metrics.csv").exists())
    table = pd.concat([cell_rows(c) for c in cells], ignore_index=True)
    table.to_csv(ROOT / "sweep.csv", index=False, float_format="%.6g")
    # the last logged training step, not the last validation, is how far a cut cell trained (its numbers are the
    # last validation's, up to a validation interval earlier)
    print("| cell | overrides | steps trained (last logged) | last validation | first step with order use >= 0.5 "
          "| val loss | order use | acc |")
    print("|---|---|---|---|---|---|---|---|")
    for name, sub in table.groupby("cell", sort=False):
        last = sub.iloc[-1]
        reached = sub[sub["val/order_use"] >= TARGET]
        first = int(reached["step"].iloc[0]) if len(reached) else "not reached"
        trained = int(pd.read_csv(sweep / name / "csv" / "metrics.csv", usecols=["step"])["step"].max()) + 1
        print(f"| {name} | `{last['overrides']}` | {trained}{'' if last['finished'] else ' (cut)'} | {int(last['step'])} "
              f"| {first} | {last['val/loss']:.3f} | {last['val/order_use']:.3f} | {last['val/acc']:.3f} |")
    cpu_table(cells_dir(ROOT / "cpu.parquet"))
    probes_table(ROOT / "probes")
    return 0


def probes_table(folder: Path) -> None:
    """Position-probe accuracy per layer (probe.py's position_probe.csv) beside order use (evaluate.py's
    order_use.csv) and the training run's last validation loss (its finished.json), one column per model folder
    (``probes/<pos>/``)."""
    models = sorted(p for p in folder.iterdir() if (p / "position_probe.csv").exists()) if folder.is_dir() else []
    if not models:
        return
    probe = {m.name: pd.read_csv(m / "position_probe.csv") for m in models}
    use = {m.name: pd.read_csv(m / "order_use.csv").iloc[0] for m in models}  # one row: the model
    print()
    print("| | " + " | ".join(f"pos={n}" for n in probe) + " |")
    print("|---|" + "---|" * len(probe))
    print("| order use (nats, evaluate.py) | " + " | ".join(f"{use[n]['order_use']:.4f}" for n in probe) + " |")
    loss = {m.name: json.loads((m / "train_finished.json").read_text())["metrics"]["val/loss"] for m in models}
    print("| val loss at the end of training (train.py) | " + " | ".join(f"{loss[n]:.3f}" for n in probe) + " |")
    print("| chance (majority position) | " + " | ".join(f"{probe[n]['chance'].iloc[0]:.3f}" for n in probe) + " |")
    for t in dict.fromkeys(next(iter(probe.values()))["transform"]):
        for layer in sorted(set(next(iter(probe.values()))["layer"])):
            cells = [probe[n][(probe[n]["transform"] == t) & (probe[n]["layer"] == layer)]["accuracy"].iloc[0]
                     for n in probe]
            print(f"| position probe, layer {layer}, {t} | " + " | ".join(f"{a:.3f}" for a in cells) + " |")


def cpu_table(folder: Path) -> None:
    """Every validation of the one-core cells, learned beside none, with the tokens seen (batch 128 x 64)."""
    cells = sorted(p for p in folder.iterdir() if (p / "csv" / "metrics.csv").exists()) if folder.is_dir() else []
    if not cells:
        return
    table = pd.concat([cell_rows(c) for c in cells], ignore_index=True)
    table.to_csv(ROOT / "cpu.csv", index=False, float_format="%.6g")
    names = list(dict.fromkeys(table["cell"]))
    print()
    print("| step | tokens | " + " | ".join(f"{n}: val loss | order use" for n in names) + " |")
    print("|---|---|" + "---|---|" * len(names))
    for step, sub in table.groupby("step"):
        by = {r["cell"]: r for _, r in sub.iterrows()}
        cols = [f"{by[n]['val/loss']:.3f} | {by[n]['val/order_use']:.3f}" if n in by else "– | –" for n in names]
        print(f"| {step} | {step * 128 * 64 / 1e6:.1f}M | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    sys.exit(main())
