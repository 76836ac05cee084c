"""Every study the docs report, as the one aggregator command that made it, and the one command that remakes them all.

    python -m outlierlab.studies.committed              # every study, then every generated doc table
    python -m outlierlab.studies.committed order_use/study_large   # one study (its folder under docs/)

Each study's cells are a committed table (``docs/<area>/<name>.parquet``, :mod:`outlierlab.studies.table`); its
outputs are regenerated from them by :data:`STUDIES`' command, run from the repository root, into the study's
folder, and committed compact:

* ``study.md`` as the aggregator writes it;
* ``contrasts.csv.xz``, every test a claim rests on, in every study (xz: about half of gzip's bytes on these tables;
  pandas reads both);
* ``study.csv.xz`` (the curves: group x step x layer x metric) only where a generated doc table or a page reads it,
  :data:`STUDY_CSV_READ`; every other study.md names, in place of the file, the command that writes it;
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

#: The studies whose ``study.csv`` a generated doc table (:mod:`outlierlab.studies.doc_tables`) or a page's link reads,
#: so committed as ``study.csv.xz``. The others' curves are a rerun of their command away and would add 2.5 MB of xz
#: to docs/; ``tests/test_committed_studies.py`` derives this set from the readers and fails where it differs.
STUDY_CSV_READ = frozenset({
    "emergence/seeds/study", "emergence/switch_seeds/study", "emergence/seeds_gpu/study",
    "emergence/switch_seeds_gpu/study", "emergence/seeds_evaluate/study", "order_use/study_objectives",
})

#: What the aggregator writes into a study folder (and :func:`regenerate` replaces).
AGGREGATOR_OUTPUTS = ("study.md", "study.csv*", "contrasts.csv*", "curves")
_FIGURE = re.compile(r"[\w./-]+\.png")
_STUDY_CSV = re.compile(r"[\w./-]+/study\.csv(?:\.xz|\.gz)?")


def _linked(pattern: re.Pattern, docs: Path) -> set[Path]:
    """Every file under ``docs`` that a page of the docs (or the README) names by ``pattern``, resolved against the
    page's folder and against the repository root."""
    found = set()
    for page in [*docs.rglob("*.md"), docs.parent / "README.md"]:
        for link in pattern.findall(page.read_text()):
            for base in (page.parent, docs.parent):
                if (base / link).resolve().is_relative_to(docs.resolve()):
                    found.add((base / link).resolve())
    return found


def shown_figures(docs: Path = DOCS) -> set[Path]:
    """Every PNG a page of the docs (or the README) links to, resolved against the page's folder."""
    return _linked(_FIGURE, docs)


def linked_study_csvs(docs: Path = DOCS) -> set[str]:
    """The folders (relative to ``docs``) whose ``study.csv`` (or its .xz / .gz) a page of the docs or the README
    links to: a study the reader is sent to for its curves."""
    return {str(p.parent.relative_to(docs.resolve())) for p in _linked(_STUDY_CSV, docs)}


def argv_of(folder: str) -> list[str]:
    """The aggregator arguments of the study in ``docs/<folder>``, ``--out`` always explicit."""
    argv = shlex.split(STUDIES[folder])
    return argv if "--out" in argv else [*argv, "--out", f"docs/{folder}"]


#: Where the command a study.md names for its uncommitted study.csv writes: a scratch folder, so that running it
#: leaves the committed folder (and its compact outputs) as they are.
SCRATCH = "/tmp/study"
_ALL_METRICS = re.compile(r"^All metrics, steps and layers: `study\.csv`( and `contrasts\.csv`)?\.$", re.M)


def without_study_csv(md: str, folder: str) -> str:
    """The aggregator's ``study.md`` of ``docs/<folder>`` with its last line, which points at ``study.csv``, saying
    instead that the file is not committed and which command writes it."""
    argv = argv_of(folder)
    i = argv.index("--out")
    command = f"python -m outlierlab.studies.aggregate {shlex.join([*argv[:i], *argv[i + 2:]])} --out {SCRATCH}"

    def line(m: re.Match) -> str:
        tests = "Every test: `contrasts.csv`. " if m.group(1) else ""
        return (f"{tests}All metrics, steps and layers, `study.csv`: not committed (no page reads it); "
                f"`{command}` writes it.")

    new, n = _ALL_METRICS.subn(line, md)
    if n != 1:
        raise ValueError(f"docs/{folder}/study.md: no line 'All metrics, steps and layers: `study.csv` ...' to "
                         "rewrite; the aggregator's report.py changed its last line, update committed._ALL_METRICS")
    return new


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
        (staged / "study.md").write_text(md if folder in STUDY_CSV_READ else without_study_csv(md, folder))
        for name in ("study.csv", "contrasts.csv") if folder in STUDY_CSV_READ else ("contrasts.csv",):
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
