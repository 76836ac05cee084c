"""Copy the small files of a sweep's finished cells into a study table (or a folder) that can be committed and
aggregated again.

    python scripts/export_cells.py multirun/emergence_seeds docs/emergence/seeds.parquet   # one table (committed form)
    python scripts/export_cells.py multirun/emergence_seeds exported/seeds                 # a folder of run directories

An ``out`` ending in ``.parquet`` is a study table (:mod:`outlierlab.studies.table`: machine paths scrubbed); an
existing table keeps its cells and gains the new ones.

Per finished cell (``finished.json``): ``.hydra/overrides.yaml``, ``config.yaml``, ``finished.json``,
``csv/metrics.csv``, ``monitor_posthoc/metrics.csv`` and the live monitor histories
``monitor/{hidden_states,layernorm}.csv`` without their per-dimension rows (mean vectors, gains, biases:
hundreds of thousands of lines that the study aggregator does not average). Checkpoints, TensorBoard events,
exported models and plots stay behind. ``python -m outlierlab.studies.aggregate <out>`` then gives the same
``study.csv`` for the scalars as on the sweep itself. Cells already exported are skipped. With ``--stopped``, the
cells stopped before their budget (no ``finished.json``: a wall-clock cut) come along too, for
``python -m outlierlab.studies.aggregate <out> --until STEP``.

A cell's ``manifest.json`` (:mod:`outlierlab.jobs.run_state`) comes along, restricted to the exported files: a file
copied as is keeps its entry (so the hash still proves it is the file the run wrote); a history cut to its scalar
rows gets the entry of the cut file with the original's under ``filtered_from``; files left behind are listed under
``not_exported``. The exported cell then verifies like the original (``verify_manifest``).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

SMALL_FILES = [".hydra/overrides.yaml", ".hydra/config.yaml", "config.yaml", "finished.json", "csv/metrics.csv",
               "monitor_posthoc/metrics.csv", "monitor_posthoc/order_use.csv", "code_versions.jsonl", "probe_posthoc/position_probe.csv",
               "probe_posthoc/similarity_by_distance.csv", "probe_posthoc/order_use.csv",
               "probe_posthoc/order_use_layers.csv"]
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


def export_manifest(cell: Path, target: Path) -> None:
    """The cell's manifest restricted to what was exported (see the module docstring); no manifest, nothing."""
    from outlierlab.jobs.run_state import MANIFEST, describe_file
    from outlierlab.utils.atomic import write_atomic

    src = cell / MANIFEST
    if not src.is_file():
        return
    manifest = json.loads(src.read_text())
    files, kept = manifest.get("files", {}), {}
    for rel, entry in files.items():
        if not (target / rel).is_file():
            continue
        if rel in HISTORIES:
            kept[rel] = {**describe_file(target / rel), "filtered_from": entry}
        else:
            kept[rel] = entry
    manifest["files"] = kept
    manifest["not_exported"] = sorted(set(files) - set(kept))
    write_atomic(target / MANIFEST, json.dumps(manifest, indent=2))


def export(sweep: Path, out: Path, stopped: bool = False) -> list[str]:
    done = []
    cells = [p for p in sweep.iterdir() if (p / "finished.json").is_file()
             or (stopped and (p / ".hydra" / "overrides.yaml").is_file())]
    for cell in sorted(cells):
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
        export_manifest(cell, target)
        done.append(cell.name)
    return done


def export_table(sweep: Path, out: Path, stopped: bool = False) -> list[str]:
    """:func:`export` into the study table ``out``: its cells are unpacked beside the new ones and packed again."""
    import tempfile

    from outlierlab.studies.table import cells_dir, pack

    with tempfile.TemporaryDirectory(prefix="export_cells_") as tmp:
        folder = Path(tmp) / out.stem
        if out.is_file():
            shutil.copytree(cells_dir(out), folder, ignore=shutil.ignore_patterns(".complete"))
        done = export(sweep, folder, stopped)
        if done:
            pack(folder, out)
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--stopped", action="store_true", help="also the cells stopped before their budget")
    a = p.parse_args(argv)
    if not a.sweep.is_dir():
        print(f"error: {a.sweep} is not a directory", file=sys.stderr)
        return 1
    done = export_table(a.sweep, a.out, a.stopped) if a.out.suffix == ".parquet" else export(a.sweep, a.out, a.stopped)
    print(f"exported {len(done)} cell(s) to {a.out}: {', '.join(done) or 'none new'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
