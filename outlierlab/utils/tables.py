"""The two table writers of the project: row dicts to a CSV file (``write_csv``) and rows to a Markdown table
(``md_table``), so all CSVs share one dialect (csv's default: ``,``, minimal quoting, ``\r\n``, ``str()`` of each value,
empty for None or a missing key) and all Markdown tables one layout.  ``read_rows`` reads such a CSV back as strings;
``model_step`` reads a ``metrics.csv`` row's step, ``read_metrics`` the whole file."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from outlierlab.utils.atomic import write_atomic

__all__ = ["columns_of", "joined", "write_csv", "read_rows", "decimals", "md_table", "MODEL_STEP", "model_step",
           "model_steps", "read_metrics"]


def columns_of(rows: Iterable[Mapping[str, Any]], first: Sequence[str] = ()) -> list[str]:
    """Column order: ``first`` (those present), then every other key in first-seen order."""
    seen = dict.fromkeys(k for r in rows for k in r)
    head = [c for c in first if c in seen]
    return head + [c for c in seen if c not in head]


def joined(v: Any) -> Any:
    """A list or tuple as one ``a;b;c`` cell (evaluate.py's CSVs); anything else as is."""
    if isinstance(v, (list, tuple)):
        return ";".join(map(str, v))
    return v


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
              cell: Callable[[Any], Any] | None = None) -> Path:
    """Write ``rows`` (dicts) to ``path`` atomically.  ``columns`` fixes the header (an empty table still gets it; other
    keys are left out); None: every key in first-seen order.  ``cell`` maps each value (``joined`` for list cells)."""
    cols = list(columns) if columns is not None else columns_of(rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: cell(r.get(k, "")) for k in cols} if cell is not None else r)
    path = Path(path)
    write_atomic(path, buf.getvalue())
    return path


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of a CSV file as dicts of its strings (the csv module's reader); [] where the file cannot be read,
    so that a report states what is missing instead of failing."""
    try:
        with open(path, newline="") as fh:
            return list(csv.DictReader(fh))
    except OSError:
        return []


def decimals(x: Any, digits: int = 3) -> str:
    """A Markdown cell of evaluate.py's reports: floats rounded to ``digits`` decimals, NaN as "–"."""
    if isinstance(x, float):
        return "–" if math.isnan(x) else f"{x:.{digits}f}"
    return str(x)


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 3,
             cell: Callable[[Any], str] | None = None) -> str:
    """A Markdown table without a trailing newline: the header row, a ``---`` rule per column, then each row
    with ``cell(value)`` in every cell (default: ``decimals`` with ``digits``)."""
    if cell is None:
        def cell(x: Any) -> str:
            return decimals(x, digits)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def print_table(make: Callable[[], tuple[Sequence[str], Sequence[Sequence[Any]]]]) -> int:
    """Print the Markdown table of the ``(header, rows)`` that ``make()`` returns and return exit status 0, or print
    its ``FileNotFoundError`` as one ``error:`` line on stderr and return 2: the body of a table command
    (``python -m outlierlab.studies.position_profile``, ``...ablation_table``)."""
    import sys

    try:
        header, rows = make()
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(md_table(header, rows, cell=str))
    return 0


#: The column of ``metrics.csv`` holding, on a validation row, the ``trainer.global_step`` it was logged at (equal
#: to ``step``): present, the row is at the step of the model it measured; absent or empty, the row was logged at
#: Lightning's batch counter, one step below (runs made before validations were logged at the model's step).
MODEL_STEP = "global_step"
#: The prefix of the validation metrics (``MLMModule.on_validation_epoch_end``).
VALIDATION = "val/"


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if x != x else x


def model_step(row: Any) -> int:
    """The optimizer step of the model a row of ``metrics.csv`` measured (a ``csv.DictReader`` row or any mapping):
    its ``step``, one more for a validation row logged at Lightning's batch counter (no ``global_step``)."""
    step = int(_number(row.get("step")) or 0)
    if _number(row.get(MODEL_STEP)) is not None:
        return int(_number(row.get(MODEL_STEP)))
    validation = any(str(k).startswith(VALIDATION) and _number(v) is not None for k, v in row.items())
    return step + 1 if validation else step


def model_steps(frame: Any) -> Any:
    """``model_step`` of every row of a ``metrics.csv`` read by pandas: a Series of ints."""
    import pandas as pd

    step = pd.to_numeric(frame["step"], errors="coerce").fillna(0).astype(int)
    validation = frame[[c for c in frame.columns if str(c).startswith(VALIDATION)]].notna().any(axis=1)
    logged = (pd.to_numeric(frame[MODEL_STEP], errors="coerce") if MODEL_STEP in frame.columns
              else pd.Series(float("nan"), index=frame.index))
    return logged.where(logged.notna(), step + validation.astype(int)).astype(int)


def read_metrics(path: str | Path) -> Any:
    """A Lightning ``metrics.csv`` as a pandas DataFrame, every row at the step of the model it measured
    (``model_steps``: a validation logged the old way is one below the monitors' record); empty when absent."""
    import pandas as pd

    if not Path(path).is_file():
        return pd.DataFrame()
    frame = pd.read_csv(path)
    return frame.assign(step=model_steps(frame))
