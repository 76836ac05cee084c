"""Every study the docs report, as the one aggregator command that made it, and the one command that remakes them all.

    python -m outlierlab.studies.committed              # every study, then every generated doc table
    python -m outlierlab.studies.committed order_use/study_large   # one study (its folder under docs/)

Each study's cells are a committed table (``docs/<area>/<name>.parquet``, :mod:`outlierlab.studies.table`); its
outputs are regenerated from them by :data:`STUDIES`' command, run from the repository root, into the study's
folder, and committed compact:

* ``study.md`` as the aggregator writes it;
* ``study.csv.xz`` and ``contrasts.csv.xz`` (xz: about half of gzip's bytes on these tables; pandas reads both);
* of the curves, only the figures a page of the docs shows (``curves/<metric>__<layer>.png``): every other curve is
  the same command with ``--out`` elsewhere.

The docs quote these commands; ``tests/test_committed_studies.py`` checks each quoted one equals its entry here, so
the page and the data cannot drift apart. Then :mod:`outlierlab.studies.doc_tables` rewrites every generated table.
"""

from __future__ import annotations

import argparse
import lzma
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_LEARNED_NONE = "--contrast pos=learned,none --primary val/loss@model,val/order_use@model"
#: Cells read only for the replicate check of the mixed-code studies (outlierlab.studies.replicates)
_REPLICATES = ("--replicates docs/order_use/cells.parquet docs/order_use/cells_objectives.parquet "
               "docs/order_use/sweep.parquet")
_SCHEMES = ("--contrast pos=sinusoidal,none --contrast pos=relative,none --contrast pos=rope,none "
            "--contrast pos=alibi,none --contrast pos=learned,none --primary val/loss@model,val/order_use@model")

#: docs/ folder of each study's outputs -> the aggregator's arguments (``python -m outlierlab.studies.aggregate ...``).
STUDIES: dict[str, str] = {
    "emergence/seeds/study": "docs/emergence/seeds.parquet",
    "emergence/switch_seeds/study": "docs/emergence/switch_seeds.parquet",
    "emergence/seeds_gpu/study": "docs/emergence/seeds_gpu.parquet --out docs/emergence/seeds_gpu/study",
    "emergence/switch_seeds_gpu/study": ("docs/emergence/switch_seeds_gpu.parquet "
                                         "--out docs/emergence/switch_seeds_gpu/study"),
    "emergence/seeds_evaluate/study": (
        "docs/emergence/seeds_evaluate.parquet --no-plots --metrics anisotropy/none/anisotropy,"
        "anisotropy/none/top3_share,isotropy/none/isoscore,anisotropy/whiten/anisotropy "
        "--layers layer_1,layer_2,layer_3,layer_4"),
    "objectives/cells/study": "docs/objectives/cells.parquet --out docs/objectives/cells/study",
    "order_use/study": f"docs/order_use/cells.parquet {_LEARNED_NONE} --out docs/order_use/study",
    "order_use/study_5seeds": (
        "docs/order_use/cells.parquet docs/order_use/sweep.parquet/study_cut_learned_seed2 "
        f"docs/order_use/sweep.parquet/study_cut_learned_seed4 {_LEARNED_NONE} --until 5000 --allow-mixed-code "
        f"{_REPLICATES} --out docs/order_use/study_5seeds"),
    "order_use/study_schemes": (f"docs/order_use/cells.parquet docs/order_use/cells_schemes.parquet {_SCHEMES} "
                                f"--allow-mixed-code {_REPLICATES} --out docs/order_use/study_schemes"),
    "order_use/study_objectives": (
        "docs/order_use/cells_objectives.parquet --contrast pos=learned,none --contrast objective=mlm,clm "
        f"--until 5000 --allow-mixed-code {_REPLICATES} --out docs/order_use/study_objectives"),
    "order_use/study_large": (f"docs/order_use/cells_large.parquet {_LEARNED_NONE} --allow-mixed-code "
                              "--equivalence-margin val/loss=0.05 --out docs/order_use/study_large"),
    "order_use/study_large_mlm": f"docs/order_use/cells_large_mlm.parquet {_LEARNED_NONE} --out docs/order_use/study_large_mlm",
    "order_use/study_schemes_large": (
        f"docs/order_use/cells_large_mlm.parquet docs/order_use/cells_schemes_large.parquet {_SCHEMES} "
        "--out docs/order_use/study_schemes_large"),
    "order_use/study_schemes_large_5seeds": (
        "docs/order_use/cells_large_mlm.parquet docs/order_use/cells_schemes_large.parquet "
        f"docs/order_use/cells_schemes_large_cut.parquet {_SCHEMES} --until 4000 "
        "--out docs/order_use/study_schemes_large_5seeds"),
}

#: What the aggregator writes into a study folder (and :func:`regenerate` replaces).
AGGREGATOR_OUTPUTS = ("study.md", "study.csv*", "contrasts.csv*", "curves")
_FIGURE = re.compile(r"[\w./-]+\.png")


def shown_figures(docs: Path = DOCS) -> set[Path]:
    """Every PNG a page of the docs (or the README) links to, resolved against the page's folder."""
    shown = set()
    for page in [*docs.rglob("*.md"), docs.parent / "README.md"]:
        for link in _FIGURE.findall(page.read_text()):
            for base in (page.parent, docs.parent):
                if (base / link).resolve().is_relative_to(docs):
                    shown.add((base / link).resolve())
    return shown


def argv_of(folder: str) -> list[str]:
    """The aggregator arguments of the study in ``docs/<folder>``, ``--out`` always explicit."""
    argv = shlex.split(STUDIES[folder])
    return argv if "--out" in argv else [*argv, "--out", f"docs/{folder}"]


def write_xz(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as CSV in xz, in the aggregator's float format; the same bytes on every run (no timestamps)."""
    from outlierlab.studies.aggregate import CSV_FLOATS

    data = frame.to_csv(index=False, float_format=CSV_FLOATS).encode()
    path.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))


def regenerate(folder: str, root: Path = ROOT) -> Path:
    """Rerun one study's command from its committed cells and replace ``docs/<folder>`` with its compact outputs."""
    from outlierlab.studies import aggregate as study

    target = root / "docs" / folder
    argv = argv_of(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="study_", dir=target.parent) as tmp:
        i = argv.index("--out")
        fresh = Path(tmp) / "out"
        here = Path.cwd()
        os.chdir(root)  # the commands' paths, and the study.md header that repeats them, are the repository's
        try:
            code = study.main([*argv[:i], "--out", str(fresh), *argv[i + 2:]])
        finally:
            os.chdir(here)
        if code != 0:
            raise RuntimeError(f"the aggregator failed on {folder}: see the lines above")
        staged = Path(tmp) / "staged"
        staged.mkdir()
        md = (fresh / "study.md").read_text().replace(str(fresh), f"docs/{folder}")
        (staged / "study.md").write_text(md)
        for name in ("study.csv", "contrasts.csv"):
            if (fresh / name).is_file():
                write_xz(pd.read_csv(fresh / name), staged / f"{name}.xz")
        shown = shown_figures(root / "docs")
        for png in sorted((fresh / "curves").glob("*.png")):
            if (target / "curves" / png.name).resolve() in shown:
                (staged / "curves").mkdir(exist_ok=True)
                shutil.copy2(png, staged / "curves" / png.name)
        target.mkdir(exist_ok=True)
        for old in AGGREGATOR_OUTPUTS:  # the aggregator's files only: a report beside them stays
            for path in target.glob(old):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        for path in staged.iterdir():
            path.rename(target / path.name)
    return target


def generated_pages(docs: Path = DOCS) -> list[Path]:
    """The pages holding a generated table block (:mod:`outlierlab.studies.doc_tables`)."""
    return sorted(p for p in docs.rglob("*.md") if "<!-- generated: " in p.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m outlierlab.studies.committed",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("studies", nargs="*", help=f"folders under docs/ (default: all): {', '.join(STUDIES)}")
    a = parser.parse_args(argv)
    unknown = [s for s in a.studies if s not in STUDIES]
    if unknown:
        print(f"error: unknown study {', '.join(unknown)}; the committed ones: {', '.join(STUDIES)}", file=sys.stderr)
        return 2
    for folder in a.studies or STUDIES:
        print(f"== {folder}: python -m outlierlab.studies.aggregate {' '.join(argv_of(folder))}", flush=True)
        regenerate(folder)
    from outlierlab.studies import doc_tables

    return doc_tables.main([str(p) for p in generated_pages()])


if __name__ == "__main__":
    sys.exit(main())
