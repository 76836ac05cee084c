"""Published training-checkpoint series as studies: a cell's training step (and seed) read from its hub revision or
model name, so ``python -m outlierlab.studies.aggregate`` draws emergence curves over published training like our own
runs.

    python evaluate.py -m encoder=pythia_160m encoder.revision=step0,step1000,step8000,step143000
    python evaluate.py -m encoder=multiberts encoder.name_or_path=google/multiberts-seed_0-step_0k,google/multiberts-seed_0-step_20k
    python -m outlierlab.studies.aggregate multirun/<date>/<time>

``series_point`` reads ``encoder.revision`` (Pythia's ``step1000``, Biderman et al. 2023; OLMo's
``step20000-tokens84B``, Groeneveld et al. 2024) and ``encoder.name_or_path`` (MultiBERTs, Sellam et al. 2022:
``google/multiberts-seed_3-step_20k``; a local ``step<N>`` directory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Override keys that name a checkpoint.
SERIES_KEYS = ("encoder.revision", "encoder.name_or_path")

_REVISION = re.compile(r"^step(\d+)(?:$|[-_].*)")  # step1000, step20000-tokens84B
_MULTIBERTS = re.compile(r"(multiberts-seed_)(\d+)(?:(-step_)(\d+)(k))?$")
_LAST_STEP = re.compile(r"(^|/)step_?(\d+)(k?)/*$")


@dataclass(frozen=True)
class SeriesPoint:
    """``value``: the override as it enters the cell's identity; ``seed`` / ``step``: what it names (None: nothing)."""

    value: str
    seed: int | None = None
    step: int | None = None


def series_point(key: str, value: str) -> SeriesPoint:
    """The seed and step named by one override (see the module docstring); other keys pass unchanged.

    Examples
    --------
    >>> series_point("encoder.revision", "step1000")
    SeriesPoint(value='step*', seed=None, step=1000)
    >>> series_point("encoder.name_or_path", "google/multiberts-seed_3-step_20k")
    SeriesPoint(value='google/multiberts-seed_*-step_*k', seed=3, step=20000)
    """
    value = str(value)
    if key == "encoder.revision":
        m = _REVISION.match(value)
        return SeriesPoint("step*", step=int(m.group(1))) if m else SeriesPoint(value)
    if key != "encoder.name_or_path":
        return SeriesPoint(value)
    m = _MULTIBERTS.search(value)
    if m:
        step = int(m.group(4)) * 1000 if m.group(4) is not None else None
        wild = m.group(1) + "*" + (m.group(3) + "*" + m.group(5) if step is not None else "")
        return SeriesPoint(value[:m.start()] + wild, seed=int(m.group(2)), step=step)
    m = _LAST_STEP.search(value)
    if m:
        step = int(m.group(2)) * (1000 if m.group(3) else 1)
        return SeriesPoint(value[:m.start()] + m.group(1) + "step*", step=step)
    return SeriesPoint(value)


def apply_series(overrides: dict[str, str], config: dict) -> tuple[int | None, int | None]:
    """Replace a cell's ``SERIES_KEYS`` overrides by their identity form; return ``(seed, step)``."""
    seed = step = None
    for key in SERIES_KEYS:
        if key not in overrides:
            continue
        p = series_point(key, overrides[key])
        if p.step is None and p.seed is None:
            continue
        overrides[key] = p.value
        if key in config:
            config[key] = p.value
        if p.step is not None and step is not None and p.step != step:
            raise ValueError(f"encoder.revision and encoder.name_or_path name different steps ({step}, {p.step})")
        seed = p.seed if p.seed is not None else seed
        step = p.step if p.step is not None else step
    return seed, step
