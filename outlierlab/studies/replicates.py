"""Replicates: cells that ran the same resolved configuration with the same seed, compared number by number.

A study may average cells of different code versions (``--allow-mixed-code``) only if the code between them
computes the same thing. The evidence for that is a replicate: the same configuration and seed run on both versions.
It is evidence for the configuration it ran and no other. On a GPU, a learned position table's gradients are
atomic adds, so replicates of one seed differ slightly unless ``trainer.deterministic=true``. A no-position path has
no such adds and reproduces exactly. So this module compares the paths actually run:

* ``replicate_rows``: every pair of readable cells (the study's, plus any given only for this check) with one
  configuration and seed, each metric of ``COMPARED`` at every step both logged: the largest absolute difference,
  with both cells' code versions and how they computed (``finished.json``: ``accelerator``, ``deterministic``);
* ``python -m outlierlab.studies.replicates RUN_DIR_OR_SWEEP ... [--out pairs.csv]``: those rows for any run
  directories, e.g. two replicates of one seed with ``trainer.deterministic=true`` (``scripts/gpu_scale.sh
  determinism``); exit 1 when no two cells share a configuration and seed;
* ``mixed_code_coverage``: per group of the study that mixes code versions, whether a replicate of *its*
  configuration spans two of its versions -- or that none does, so the mixing rests on other paths' replicates.

The configuration is the resolved config less what cannot change a number: paths, the seed itself and the
bookkeeping keys of ``outlierlab.studies.cells.SEED_DEPENDENT``, the wall-clock budget, the run's root dir.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from outlierlab.jobs.run_state import FINISHED_MARKER, read_json
from outlierlab.studies.cells import SEED_DEPENDENT, Cell, cell_numbers, find_cells, portable_config
from outlierlab.utils.atomic import write_atomic

#: The numbers a replicate is compared on: every validation's loss and order use.
COMPARED = ("val/loss", "val/order_use")
#: Settings that cannot change a number (beside :data:`SEED_DEPENDENT`): among them when and which checkpoints are
#: kept, since saving one reads the state and draws no random number (a rerun that keeps every 50-step checkpoint
#: is a replicate of the run that kept two).
_NOT_COMPUTATION = re.compile(r"(^|\.)(default_root_dir|max_time|enable_progress_bar|log_every_n_steps)$"
                              r"|^callbacks\.model_checkpoint\.")
_PATH = re.compile(r"^(<local>|<cell>|/)")


def configuration(cell: Cell) -> tuple:
    """What the cell computed, as a hashable key (the seed not included)."""
    return tuple(sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in portable_config(cell).items()
                        if not SEED_DEPENDENT.search(k) and not _NOT_COMPUTATION.search(k)
                        and not (isinstance(v, str) and _PATH.match(v))))


def how(cell: Cell) -> str:
    """``gpu, deterministic`` / ``cpu, not deterministic`` from ``finished.json``, or what is not recorded."""
    marker = read_json(cell.path / FINISHED_MARKER)
    if not isinstance(marker, dict):
        return "not recorded (not finished)"
    device, det = marker.get("accelerator"), marker.get("deterministic")
    if device is None and det is None:
        return "not recorded"
    return f"{device or 'device not recorded'}, " + (
        "deterministic" if det else "not deterministic" if det is False else "determinism not recorded")


def _validations(cell: Cell) -> pd.DataFrame:
    df = cell_numbers(cell)
    df = df[df["metric"].isin(COMPARED) & (df["layer"] == "model")]
    return df.groupby(["metric", "step"])["value"].last()


def replicate_rows(cells: Sequence[Cell], label: Mapping[tuple, str] | None = None) -> pd.DataFrame:
    """One row per pair of cells with one configuration and seed: ``path, seed, cell_a, cell_b, code_a, code_b,
    how_a, how_b, steps`` and ``max_abs_diff <metric>`` per ``COMPARED`` metric (NaN where neither logged it)."""
    by_key: dict[tuple, list[Cell]] = defaultdict(list)
    for c in cells:
        if not c.problems and c.seed is not None:  # finished or not: compared where both logged
            by_key[configuration(c), c.seed].append(c)
    rows = []
    for (config, seed), members in by_key.items():
        unique = list({c.path.resolve(): c for c in members}.values())  # one cell given twice is no replicate
        for a, b in combinations(unique, 2):
            va, vb = _validations(a), _validations(b)
            both = va.index.intersection(vb.index)
            diff = (va[both] - vb[both]).abs()
            row = {"path": (label or {}).get(config) or ",".join(f"{k}={v}" for k, v in sorted(a.overrides.items())),
                   "seed": seed, "cell_a": a.path.name, "cell_b": b.path.name, "code_a": a.code, "code_b": b.code,
                   "how_a": how(a), "how_b": how(b), "steps": int(both.get_level_values("step").nunique())}
            for metric in COMPARED:
                d = diff[diff.index.get_level_values("metric") == metric]
                row[f"max_abs_diff {metric}"] = float(d.max()) if len(d) else float("nan")
            rows.append(row)
    columns = ["path", "seed", "cell_a", "cell_b", "code_a", "code_b", "how_a", "how_b", "steps",
               *(f"max_abs_diff {m}" for m in COMPARED)]
    return pd.DataFrame(rows, columns=columns)


def linked(codes: set[str], rows: pd.DataFrame) -> bool:
    """Whether the replicate pairs connect every one of ``codes`` (each pair links its two versions; a version may be
    linked through a third one, e.g. two batches that each reproduce an earlier study)."""
    parent = {c: c for c in set(codes) | set(rows["code_a"]) | set(rows["code_b"])}

    def root(c: str) -> str:
        while parent[c] != c:
            c = parent[c]
        return c

    for a, b in zip(rows["code_a"], rows["code_b"]):
        parent[root(a)] = root(b)
    return len({root(c) for c in codes}) == 1


def mixed_code_coverage(groups: Mapping[str, list[Cell]], extra: Sequence[Cell] = ()) -> dict[str, pd.DataFrame]:
    """Per group that mixes code versions: the replicate rows of its own configuration across two code versions, one
    of them the group's (an empty frame: none ran), with ``attrs["linked"]``: whether they connect all of the group's
    versions (``linked``). Groups of one code version are left out."""
    # a study's evidence is what it could average itself: finished cells, or cells admitted up to their cut
    everyone = [c for c in [*(c for cells in groups.values() for c in cells), *extra] if c.usable]
    out: dict[str, pd.DataFrame] = {}
    for name, cells in groups.items():
        codes = {c.code for c in cells}
        if len(codes) < 2:
            continue
        configs = {configuration(c) for c in cells}
        rows = replicate_rows([c for c in everyone if configuration(c) in configs], {cfg: name for cfg in configs})
        rows = rows[(rows["code_a"] != rows["code_b"]) & (rows["code_a"].isin(codes) | rows["code_b"].isin(codes))]
        rows = rows.reset_index(drop=True)
        rows.attrs["linked"] = linked(codes, rows)
        out[name] = rows
    return out


def markdown(coverage: Mapping[str, pd.DataFrame]) -> list[str]:
    """study.md's section: per mixed-code group, its cross-version replicates or the plain statement that none ran."""
    if not coverage:
        return []
    verdicts = [f"{name}: {'linked' if rows.attrs.get('linked') else 'NOT linked'}" for name, rows in coverage.items()]
    lines = ["", "## Replicates across code versions", "",
             "Groups that average cells of different code versions (`--allow-mixed-code`), each with the replicates of "
             "its own configuration across two code versions (same resolved config and seed): the largest absolute "
             "difference over every validation both logged. *Linked*: the replicates connect all of the group's "
             "versions. A group without one rests on other configurations' replicates, which say nothing about it. "
             + "; ".join(verdicts) + ".", "",
             "| group | seed | cells | code | how | steps | max abs diff val loss | max abs diff order use |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rows in coverage.items():
        if rows.empty:
            lines.append(f"| {name} | – | no replicate of this configuration on another code version | – | – | – | – "
                         "| – |")
            continue
        for d in rows.to_dict("records"):
            lines.append(f"| {name} | {d['seed']} | {d['cell_a']} / {d['cell_b']} | {d['code_a']} / {d['code_b']} | "
                         f"{d['how_a']} / {d['how_b']} | {d['steps']} | {d['max_abs_diff val/loss']:.2g} | "
                         f"{d['max_abs_diff val/order_use']:.2g} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m outlierlab.studies.replicates",
                                     description="Replicates (same configuration and seed) among run directories, "
                                                 "compared on every validation's loss and order use.")
    parser.add_argument("paths", nargs="+", help="run directories, sweep directories or packed study tables")
    parser.add_argument("--out", help="also write the rows as CSV")
    a = parser.parse_args(argv)
    rows = replicate_rows(find_cells(a.paths))
    if rows.empty:
        print("no two readable cells share a configuration and seed: nothing to compare", file=sys.stderr)
        return 1
    print(rows.to_string(index=False))
    if a.out:
        write_atomic(Path(a.out), rows.to_csv(index=False))  # never a table cut by a full disk or a kill
    return 0


if __name__ == "__main__":
    sys.exit(main())
