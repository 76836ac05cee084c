"""Append-only CSV history of the outlier monitors: ``<run>/monitor/layernorm.csv``, ``hidden_states.csv``.

Long format, one row per step × LayerNorm/layer × statistic (× dim)::

    step,name,statistic,dim,value
    0,layer.1.output,n_gain_outliers,,0
    50,layer.1.output,gain_outlier,77,1.734
    50,layer_4,argmax_share,77,0.41

``step``: optimizer step (0 = before any update).  ``name``: a LayerNorm (``embeddings``,
``layer.{i}.attention_output``, ``layer.{i}.output``) or ``model``; in ``hidden_states.csv`` ``layer_{i}`` (0 = the
embedding output).  ``statistic``: see ``monitor_records.layernorm_records`` / ``hidden_state_records``.  ``dim``: the
hidden dimension, empty for scalars.  ``value``: ``%.8g``.

Rows are appended with flush + ``os.fsync`` per record; a failed write (full disk) cuts the file back to its last
complete row, and a line torn by a kill is skipped by every reader here and removed on the next start.  On resume the
rows after the resumed step go by an atomic rewrite.  Read with ``history_frame`` or ``read_history`` (complete rows
only; a bare ``pandas.read_csv`` would parse a torn ``0.11982517`` cut to ``0.1``).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from outlierlab.utils.atomic import write_atomic

COLUMNS = ("step", "name", "statistic", "dim", "value")


def _fmt(x) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, int):
        return str(x)
    return f"{float(x):.8g}"


def _parse(fields: list[str]) -> dict | None:
    """A parsed row, or None for a malformed (e.g. torn) line."""
    if len(fields) != len(COLUMNS):
        return None
    try:
        return {"step": int(fields[0]), "name": fields[1], "statistic": fields[2],
                "dim": int(fields[3]) if fields[3] != "" else None, "value": float(fields[4])}
    except ValueError:
        return None


class HistoryCSV:
    """One history file; every method is a no-op-safe plain file operation (callers ensure rank 0)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def _lines(self) -> tuple[list[str], list[dict]]:
        """Raw valid lines (without header) and their parsed rows; malformed lines are skipped."""
        if not self.path.is_file():
            return [], []
        raw, rows = [], []
        lines = self.path.read_bytes().decode("utf-8").splitlines(keepends=True)  # line ends as written
        for i, line in enumerate(lines):
            if i == 0 and line.startswith("step,"):
                continue
            if not line.endswith("\n"):
                continue  # torn last line of a crashed write
            fields = next(csv.reader([line]), [])
            row = _parse(fields)
            if row is not None:
                raw.append(line)
                rows.append(row)
        return raw, rows

    def rows(self) -> list[dict]:
        return self._lines()[1]

    def steps(self) -> set[int]:
        return {r["step"] for r in self.rows()}

    def truncate_after(self, step: int) -> None:
        """Keep only rows with ``row.step <= step`` (dropping malformed lines), atomically; ``step = -1`` empties the
        history."""
        if not self.path.is_file():
            return
        raw, rows = self._lines()
        kept = [line for line, r in zip(raw, rows) if r["step"] <= step]
        # the project's atomic writer: a write that fails (a full disk at a resume) removes its staging file
        write_atomic(self.path, ",".join(COLUMNS) + "\n" + "".join(kept))

    def append(self, rows: Iterable[Sequence]) -> None:
        """Append ``(step, name, statistic, dim, value)`` rows; flushed and fsynced before returning."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerows((_fmt(s), n, st, _fmt(d), _fmt(v)) for s, n, st, d, v in rows)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        size = self.path.stat().st_size if self.path.is_file() else 0
        payload = ("" if size else ",".join(COLUMNS) + "\n") + buf.getvalue()
        # binary append: the file offset to cut back to is a byte count
        with self.path.open("ab") as fh:
            try:
                fh.write(payload.encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            except OSError as e:
                # a full disk mid-record: cut back to the last complete row, so no reader ever sees a torn one
                try:
                    fh.truncate(size)
                    os.fsync(fh.fileno())
                except OSError:
                    pass
                raise OSError(e.errno, f"cannot append to {self.path}: {e.strerror}; the history ends at its last "
                                       "complete record -- free space there and resume the run") from e


def read_history(path: str | os.PathLike, statistics: Iterable[str] | None = None) -> list[dict]:
    """Parsed rows of a history file (``dim`` None when empty), optionally only some statistics."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r}: pass the path of a history file (e.g. <run>/monitor/hidden_states.csv)")
    if isinstance(statistics, (str, bytes)):  # its characters would be the statistics kept: no row, no error
        raise TypeError(f"statistics={statistics!r} is a single string: pass a list, e.g. statistics=[{statistics!r}]")
    p = Path(path)
    if p.is_dir():  # a run directory (or its monitor/): which of its histories is the caller's to say
        found = sorted(str(f.relative_to(p)) for f in [*p.glob("*.csv"), *p.glob("monitor*/*.csv")])[:4]
        raise IsADirectoryError(f"{p} is a directory: pass one history file in it"
                                + (f", e.g. {', '.join(found)}" if found else " (e.g. monitor/hidden_states.csv)"))
    if not p.is_file():
        raise FileNotFoundError(f"monitor history {p} not found (was the run trained with the monitors on?)")
    rows = HistoryCSV(p).rows()
    if statistics is not None:
        keep = set(statistics)
        rows = [r for r in rows if r["statistic"] in keep]
    return rows


def history_frame(path: str | os.PathLike, statistics: Iterable[str] | None = None):
    """A history file as a pandas DataFrame (columns ``step, name, statistic, dim, value``; ``dim`` nullable
    integers), complete rows only: the reader to use instead of ``pandas.read_csv`` (see the module docstring)."""
    import pandas as pd

    rows = read_history(path, statistics)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype({"step": "int64", "dim": "Int64", "value": "float64"})


def vectors_by_step(rows: Iterable[dict], statistic: str) -> dict[str, tuple[list[int], torch.Tensor]]:
    """``name -> (steps, Tensor[S, d])`` for a per-dim statistic (``gain``, ``bias``, ``mean``), e.g. per-dim divergence
    from init: ``gain[s] - gain[0]`` (step 0 is always recorded)."""
    acc: dict[str, dict[int, dict[int, float]]] = {}
    for r in rows:
        if r["statistic"] == statistic and r["dim"] is not None:
            acc.setdefault(r["name"], {}).setdefault(r["step"], {})[r["dim"]] = r["value"]
    out = {}
    for name, by_step in acc.items():
        steps = sorted(by_step)
        d = 1 + max(max(v) for v in by_step.values())
        m = torch.full((len(steps), d), float("nan"))
        for i, s in enumerate(steps):
            idx = torch.tensor(list(by_step[s].keys()))
            m[i, idx] = torch.tensor(list(by_step[s].values()))
        out[name] = (steps, m)
    return out


def wide_by_layer(rows: Iterable, statistics: Sequence[str], with_dims: Sequence[str] = ()) -> list[dict]:
    """Long history rows (dicts or ``(step, name, statistic, dim, value)``) -> one dict per (step, layer) of the
    ``layer_{i}`` names, ``statistics`` in order plus ``<statistic>_dim`` for ``with_dims``; missing values are ""."""
    table: dict[tuple[int, int], dict] = {}
    for r in rows:
        step, name, stat, dim, value = ((r["step"], r["name"], r["statistic"], r["dim"], r["value"])
                                        if isinstance(r, dict) else r)
        if not str(name).startswith("layer_") or stat not in statistics:
            continue
        rec = table.setdefault((int(step), int(str(name)[6:])), {"step": int(step), "layer": int(str(name)[6:])})
        if stat in rec:  # several rows per layer (per-dim vectors, top dims): not a per-layer scalar
            continue
        rec[stat] = value
        if stat in with_dims:
            rec[f"{stat}_dim"] = "" if dim is None else dim
    out = []
    for key in sorted(table):
        rec = table[key]
        row = {"step": rec["step"], "layer": rec["layer"]}
        for c in statistics:
            if c in with_dims:
                row[f"{c}_dim"] = rec.get(f"{c}_dim", "")
            row[c] = rec.get(c, "")
        out.append(row)
    return out
