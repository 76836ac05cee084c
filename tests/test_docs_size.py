"""docs/ stays at most 15.5 MB (docs/studies.md, "What docs/ weighs"): the study tables are Brotli-compressed Parquet
and every committed figure is a palette PNG, so the page a reader opens and the data its numbers come from travel
with every checkout without crowding it."""

from __future__ import annotations

import pyarrow.parquet as pq
from PIL import Image

from outlierlab.studies.table import COMPRESSION
from tests.conftest import ROOT

DOCS = ROOT / "docs"
#: The budget of docs/, in bytes (the files' sizes, as ``du -sb docs`` adds them).
LIMIT = 15_500_000


def docs_bytes() -> int:
    return sum(p.stat().st_size for p in DOCS.rglob("*") if p.is_file())


def test_docs_stay_within_their_budget():
    size = docs_bytes()
    largest = sorted(((p.stat().st_size, p.relative_to(ROOT).as_posix()) for p in DOCS.rglob("*") if p.is_file()),
                     reverse=True)[:5]
    assert size <= LIMIT, (f"docs/ holds {size:,} bytes, above its {LIMIT:,}; the largest files: {largest} "
                           "(python scripts/checkout_size.py)")


def test_every_study_table_is_compressed_as_pack_writes_it():
    tables = sorted(DOCS.rglob("*.parquet"))
    assert tables
    codec = COMPRESSION["compression"].upper()
    other = [p.relative_to(ROOT).as_posix() for p in tables
             if {pq.ParquetFile(p).metadata.row_group(i).column(c).compression
                 for i in range(pq.ParquetFile(p).metadata.num_row_groups) for c in range(3)} != {codec}]
    assert not other, f"not {codec}: {other} (python -m outlierlab.studies.table pack writes them so)"


def test_every_committed_figure_is_a_palette_png():
    figures = sorted(DOCS.rglob("*.png"))
    assert figures
    rgb = []
    for path in figures:
        with Image.open(path) as im:
            if im.mode != "P":
                rgb.append(path.relative_to(ROOT).as_posix())
    assert not rgb, (f"not a palette PNG: {rgb} -- store it as outlierlab.studies.report.save_palette_png does "
                     "(Image.convert('RGB').quantize(colors=256))")
