"""Copy the small files of a sweep's finished cells into a folder that can be committed and aggregated again.

    python scripts/export_cells.py multirun/emergence_seeds docs/emergence/seeds

Per finished cell (``finished.json``): ``.hydra/overrides.yaml``, ``config.yaml``, ``finished.json``,
``csv/metrics.csv``, ``monitor_posthoc/metrics.csv`` and the live monitor histories
``monitor/{hidden_states,layernorm}.csv`` without their per-dimension rows (mean vectors, gains, biases:
hundreds of thousands of lines that the study aggregator does not average). Checkpoints, TensorBoard events,
exported models and plots stay behind. ``python -m outlierlab.jobs.study <out>`` then gives the same
``study.csv`` for the scalars as on the sweep itself. Cells already exported are skipped.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from collections import Counter
from pathlib import Path

SMALL_FILES = [".hydra/overrides.yaml", ".hydra/config.yaml", "config.yaml", "finished.json", "csv/metrics.csv",
               "monitor_posthoc/metrics.csv"]
HISTORIES = ["monitor/hidden_states.csv", "monitor/layernorm.csv"]


def scalar_rows(src: Path, dst: Path) -> int:
    """Copy a long-format monitor history keeping only (step, name, statistic) triples with one row."""
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    count = Counter((r["step"], r["name"], r["statistic"]) for r in rows)
    kept = [r for r in rows if count[r["step"], r["name"], r["statistic"]] == 1]
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["step", "name", "statistic", "dim", "value"])
        w.writeheader()
        w.writerows(kept)
    return len(kept)


def export(sweep: Path, out: Path) -> list[str]:
    done = []
    for cell in sorted(p for p in sweep.iterdir() if (p / "finished.json").is_file()):
        target = out / cell.name
        if (target / "finished.json").is_file():
            continue
        for rel in SMALL_FILES:
            if (cell / rel).is_file():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(cell / rel, target / rel)
        for rel in HISTORIES:
            if (cell / rel).is_file():
                scalar_rows(cell / rel, target / rel)
        done.append(cell.name)
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", type=Path)
    p.add_argument("out", type=Path)
    a = p.parse_args(argv)
    if not a.sweep.is_dir():
        print(f"error: {a.sweep} is not a directory", file=sys.stderr)
        return 1
    done = export(a.sweep, a.out)
    print(f"exported {len(done)} finished cell(s) to {a.out}: {', '.join(done) or 'none new'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
