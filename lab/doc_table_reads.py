"""What every generated doc table reads, and how it writes a number: the committed study outputs
(``study.csv``, ``contrasts.csv``, ``families.csv``, compressed where ``lab.committed`` keeps them so)
and the formats of the docs' cells.  The tables themselves are ``lab.doc_tables`` (seed studies,
objectives, the loop monitors) and ``lab.order_use_doc_tables`` (docs/order_use.md); every read goes
through ``read`` and every contrasts row through ``contrast_at``, which the tests record to derive what the
committed files must keep.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def cells_of(study: str) -> Path:
    """Where a study's cells are read from: its table ``<study>.parquet`` (``outlierlab.studies.table``), or
    the folder of run directories itself where none was packed."""
    table = ROOT / f"{study}.parquet"
    return table if table.is_file() else ROOT / study


def shown(path: Path) -> str:
    """``path`` as the docs name it: relative to the repository (a table ``x.parquet`` or a folder)."""
    return str(path.relative_to(ROOT))


def fmt(x: float, digits: int = 2) -> str:
    if x is None or not math.isfinite(float(x)):
        return "–"
    x = float(x)
    if x != 0 and abs(x) < 0.01:
        return f"{x:.1e}".replace("-", "−")
    places = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else digits
    return f"{x:.{places}f}".replace("-", "−")


def signed(x: float) -> str:
    return ("+" if math.isfinite(x) and x > 0 else "") + fmt(x)


def source(path: str) -> str:
    """``path``, or ``path.xz`` / ``path.gz`` where the docs keep the aggregator's CSV compressed
    (``lab.committed``)."""
    for candidate in (path, f"{path}.xz", f"{path}.gz"):
        if (ROOT / candidate).is_file():
            return candidate
    return path


@lru_cache(maxsize=None)
def read(path: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / source(path))


def summary_cell(study: str, group: str, metric: str, layer: str, step: int | None = None) -> str:
    """``mean ± t half-width`` or ``mean [low, high]`` (bounded measures), at ``step`` (default: the last)."""
    s = read(f"{study}/study/study.csv")
    sub = s[(s["group"] == group) & (s["metric"] == metric) & (s["layer"] == layer)]
    r = sub[sub["step"] == (sub["step"].max() if step is None else step)].iloc[0]
    if not math.isfinite(r["ci_low"]):
        return fmt(r["mean"])
    if str(r["ci"]).startswith("Student"):
        return f"{fmt(r['mean'])} ± {fmt(r['ci_high'] - r['mean'])}"
    return f"{fmt(r['mean'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]"


def contrast_at(folder: str, contrast: str | None, metric: str, layer: str, step: int | None = None) -> pd.Series | None:
    """The first row of ``<folder>/contrasts.csv`` of ``contrast`` (None: any) on ``metric`` and ``layer`` at ``step``
    (default: the series' last), or None where it has none. Every table reads its contrasts rows here (but for
    ``lab.doc_tables.switch_seeds_all_measures``' last-step rows and ``families_line``'s counts): the committed file keeps
    the per-step curves only at their last step and in the series read at earlier steps
    (``lab.committed.CONTRASTS_READ``, whose table entries a test derives from these calls)."""
    c = read(f"{folder}/contrasts.csv")
    sub = c[(c["metric"] == metric) & (c["layer"] == layer) & ((c["contrast"] == contrast) if contrast else True)]
    sub = sub[sub["step"] == (sub["step"].max() if step is None else step)]
    return None if sub.empty else sub.iloc[0]


def contrast_row(study: str, contrast: str, metric: str, layer: str, step: int | None = None) -> pd.Series:
    return contrast_at(f"{study}/study", contrast, metric, layer, step)


#: The families whose rows carry a Holm p (confirmatory) and those with a BH q only (the study aggregator's,
#: :mod:`outlierlab.studies.design`; "secondary" is the pooled BH family of studies written before).
HOLM_FAMILIES = ("primary", "performance")
BH_FAMILIES = ("exploratory", "exploratory performance", "secondary")


def adjusted(r: pd.Series) -> str:
    if r["family"] in HOLM_FAMILIES:
        return f"{fmt(r['p_holm'], 3)} (Holm{'' if r['family'] == 'primary' else ', ' + r['family']})"
    if r["family"] in BH_FAMILIES:
        return f"{fmt(r['q_bh'], 3)} (BH{'' if r['family'] == 'secondary' else ', ' + r['family']})"
    return str(r["family"])


def seeds_word(r: pd.Series) -> str:
    m = re.match(r"(\d+)/(\d+) seeds a ([<>]) b", str(r["ordering"]))
    return f"{m.group(1)}/{m.group(2)} {m.group(3)}" if m else str(r["ordering"])


def families_line(study: str, after_step: int = 1) -> str:
    """Each family's size and rejections in the full contrasts table of ``<study>/study`` (and from ``after_step``
    on), from its ``families.csv`` (``lab.committed.family_counts``): the committed
    contrasts.csv keeps only part of the exploratory and not-tested rows."""
    path = f"{study}/study/families.csv"
    counts = read(path)

    def total(family: str, column: str = "rows", since: int = 0) -> int:
        return int(counts.loc[(counts["family"] == family) & (counts["step"] >= since), column].sum())

    if "secondary" in set(counts["family"]):  # a study written before the declared families
        return (f"Families ({source(path)}): primary {total('primary')} contrasts, "
                f"{total('primary', 'p_holm_below_05')} with Holm p < 0.05; secondary {total('secondary')}, "
                f"{total('secondary', 'q_bh_below_05')} with BH q < 0.05 ({total('secondary', since=after_step)} from "
                f"step {after_step:,} on, {total('secondary', 'q_bh_below_05', after_step)} with q < 0.05; raw p < 0.05: "
                f"{total('secondary', 'p_below_05', after_step)}); not tested (constant or one seed) "
                f"{total('not tested')}, post-hoc duplicates of a monitor row {total('duplicate')}.")
    parts = []
    for family in HOLM_FAMILIES:
        n = total(family)
        parts.append(f"{family} {n} test{'' if n == 1 else 's'}, {total(family, 'p_holm_below_05')} with Holm p < 0.05")
    for family in BH_FAMILIES[:2]:
        parts.append(f"{family} {total(family)}, {total(family, 'q_bh_below_05')} with BH q < 0.05 within it "
                     f"({total(family, since=after_step)} from step {after_step:,} on, "
                     f"{total(family, 'q_bh_below_05', after_step)} with q < 0.05; "
                     f"raw p < 0.05: {total(family, 'p_below_05', after_step)})")
    return (f"Families ({source(path)}, the full contrasts table), each corrected within itself: " + "; ".join(parts)
            + f"; not tested (constant or one seed) {total('not tested')}, post-hoc duplicates "
            f"of a monitor row {total('duplicate')}.")
