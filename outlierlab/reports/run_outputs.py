"""The rule evaluate and probe follow in a reused directory: the run's index file (``results.json``,
``probe_info.json``) names every file it wrote, and the next run removes exactly those, the index first, before
writing its own.  Nothing else of an ``out_dir`` is removed; a run stopped half-way leaves no index.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

#: An index entry standing for the TensorBoard event files in ``tensorboard/``.
TENSORBOARD = "tensorboard/"


def output_names(paths: Sequence[str | Path], index: str, tensorboard: bool) -> list[str]:
    """The names an index lists: the files written, the index itself and, with ``tensorboard``, the events."""
    return sorted({Path(p).name for p in paths} | {index} | ({TENSORBOARD} if tensorboard else set()))


def remove_earlier_outputs(run_dir: Path, index: str, listed: Callable[[Any], Sequence[Any] | None],
                           say: tuple[str, str] | None = None) -> list[str]:
    """Remove (and return) the files an earlier run's ``index`` lists (``listed`` None: not this writer's), names with
    a path separator aside; ``say``: (tool, what it writes), for one line naming what was replaced."""
    try:
        earlier = json.loads((run_dir / index).read_text())
    except (OSError, ValueError):
        return []
    files = listed(earlier)
    if not isinstance(files, (list, tuple)):
        return []
    names = [f for f in files if isinstance(f, str) and f]
    removed = []
    for name in sorted(names, key=lambda f: f != index):  # the index first
        if name == TENSORBOARD:
            events = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
            for e in events:
                e.unlink(missing_ok=True)
            if events:
                removed.append(TENSORBOARD)
            continue
        if "/" in name or "\\" in name or name in (".", ".."):
            continue
        path = run_dir / name
        if path.is_file():
            path.unlink()
            removed.append(name)
    if removed and say:
        print(f"[{say[0]}] {run_dir} held an earlier {say[1]}: its {len(removed)} output(s) are replaced by this run's "
              f"({', '.join(removed[:6])}{', ...' if len(removed) > 6 else ''})", flush=True)
    return removed
