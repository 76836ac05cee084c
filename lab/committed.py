"""Every study the docs report, as the one aggregator command that made it, and the one command that remakes them all.

    python -m lab.committed              # every study, then every generated doc table
    python -m lab.committed order_use/study_large   # one study (its folder under docs/)

Each study's cells are a committed table (``docs/<area>/<name>.parquet``, ``outlierlab.studies.table``); its
outputs are regenerated from them by ``STUDIES``' command, run from the repository root, into the study's
folder, and committed compact:

* ``study.md`` as the aggregator writes it;
* ``contrasts.csv.xz``, in every study: every row of the confirmatory and performance families (and the
  duplicates), and of the per-step curves (families ``exploratory`` and ``not tested``) only each series' last
  step and the rows a page reads at earlier steps, ``committed_contrasts``; p and q are the full
  family's, as the aggregator corrected them (xz: about half of gzip's bytes on these tables; pandas reads both);
* ``families.csv.xz``: per family and step, the rows of the full table and those below 0.05 (Holm p, BH q, raw
  p), ``family_counts``, so that a page's family sizes stay those of the full table;
* ``study.csv.xz`` (the curves: group x step x layer x metric) only where a generated doc table or a page reads it,
  ``STUDY_CSV_READ``; every other study.md names, in place of the file, the command that writes it;
* of the curves, only the figures a page of the docs shows (``curves/<metric>__<layer>.png``): every other curve is
  the same command with ``--out`` elsewhere.

The docs quote these commands; ``tests/test_committed_studies.py`` checks each quoted one equals its entry here, so
the page and the data cannot drift apart. Then ``lab.doc_tables`` rewrites every generated table.
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

ROOT = Path(__file__).resolve().parents[1]
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

#: The studies whose ``study.csv`` a generated doc table (:mod:`lab.doc_tables`) or a page's link reads,
#: so committed as ``study.csv.xz``. The others' curves are a rerun of their command away and would add 2.5 MB of xz
#: to docs/; ``tests/test_committed_studies.py`` derives this set from the readers and fails where it differs.
STUDY_CSV_READ = frozenset({
    "emergence/seeds/study", "emergence/switch_seeds/study", "emergence/seeds_gpu/study",
    "emergence/switch_seeds_gpu/study", "emergence/seeds_evaluate/study", "order_use/study_objectives",
})

#: The families whose rows are per-step curves rather than tests a claim rests on: a committed contrasts.csv keeps
#: them only at each series' last step and where a page reads them (:func:`committed_contrasts`); 66-88% of
#: a study's rows, most of the docs' contrasts bytes. Every other family (primary, performance, exploratory performance,
#: duplicate) is committed whole.
CURVE_FAMILIES = ("exploratory", "not tested")
#: One series of a contrasts table: a contrast between two groups on one metric and layer, over the steps.
SERIES = ["contrast", "group_a", "group_b", "metric", "layer"]
#: The curve rows of a study's contrasts.csv that a page reads before their series' last step, committed whatever
#: their family: (metric, layer, step), None for every layer or every step. Order use at every validation step
#: (:func:`lab.order_use_doc_tables.order_use_schemes`) and the step-0 argmax share at every layer that
#: docs/emergence.md quotes. ``tests/test_committed_studies.py`` derives the tables' entries from the readers and
#: checks the page's numbers against its entry; it fails where this differs.
CONTRASTS_READ: dict[str, frozenset[tuple[str, str | None, int | None]]] = {
    **{folder: frozenset({("val/order_use", "model", None)}) for folder in
       ("order_use/study_schemes", "order_use/study_schemes_large", "order_use/study_schemes_large_5seeds")},
    "emergence/seeds/study": frozenset({("hidden/argmax_share", None, 0)}),
}

#: What the aggregator writes into a study folder (and :func:`regenerate` replaces).
AGGREGATOR_OUTPUTS = ("study.md", "study.csv*", "contrasts.csv*", "families.csv*", "curves")
_FIGURE = re.compile(r"[\w./-]+\.png")


def linked(pattern: re.Pattern, docs: Path) -> set[Path]:
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
    return linked(_FIGURE, docs)


def argv_of(folder: str) -> list[str]:
    """The aggregator arguments of the study in ``docs/<folder>``, ``--out`` always explicit."""
    argv = shlex.split(STUDIES[folder])
    return argv if "--out" in argv else [*argv, "--out", f"docs/{folder}"]


#: Where the command a study.md names for its full tables writes: a scratch folder, so that running it leaves the
#: committed folder (and its compact outputs) as they are.
SCRATCH = "/tmp/study"
_ALL_METRICS = re.compile(r"^All metrics, steps and layers: `study\.csv`( and `contrasts\.csv`)?\.$", re.M)


def scratch_command(folder: str) -> str:
    """The registry's command of ``docs/<folder>`` writing into ``SCRATCH``: the full tables."""
    argv = argv_of(folder)
    i = argv.index("--out")
    return f"python -m outlierlab.studies.aggregate {shlex.join([*argv[:i], *argv[i + 2:]])} --out {SCRATCH}"


def committed_md(md: str, folder: str, kept: int | None = None, total: int | None = None) -> str:
    """The aggregator's ``study.md`` of ``docs/<folder>`` with its last line, which points at ``study.csv`` and
    ``contrasts.csv``, saying what is committed of them: ``kept`` of the ``total`` rows of contrasts.csv and by which
    rule, and ``study.csv`` only where a page reads it; and the command that writes both in full."""
    def line(m: re.Match) -> str:
        parts = ["All metrics, steps and layers: `study.csv`." if folder in STUDY_CSV_READ else
                 "All metrics, steps and layers, `study.csv`: not committed (no page reads it)."]
        if m.group(1):
            parts.append(f"Tests: `contrasts.csv`, {kept:,} of its {total:,} rows: all but the per-step curves of the "
                         f"{' and '.join(CURVE_FAMILIES)} families, kept at the last step of each contrast, metric and "
                         "layer and where a page reads them; p_holm and q_bh are the full family's. "
                         "`families.csv`: each family's rows and rejections per step in the full table.")
            parts.append(f"`{scratch_command(folder)}` writes the full tables.")
        elif folder not in STUDY_CSV_READ:
            parts.append(f"`{scratch_command(folder)}` writes it.")
        return " ".join(parts)

    found = _ALL_METRICS.search(md)
    if found and found.group(1) and (kept is None or total is None):
        raise ValueError(f"docs/{folder}/study.md: the committed rows of contrasts.csv are needed to rewrite its last line")
    new, n = _ALL_METRICS.subn(line, md)
    if n != 1:
        raise ValueError(f"docs/{folder}/study.md: no line 'All metrics, steps and layers: `study.csv` ...' to "
                         "rewrite; the aggregator's report.py changed its last line, update committed._ALL_METRICS")
    return new


def committed_contrasts(contrasts: pd.DataFrame, folder: str) -> pd.DataFrame:
    """The rows of a study's full ``contrasts.csv`` that ``docs/<folder>`` commits, in the aggregator's order: every
    row of a family not in ``CURVE_FAMILIES``; of those, the last step of each ``SERIES`` and every
    row ``CONTRASTS_READ`` names. The values are the full table's (no correction is redone)."""
    keep = ~contrasts["family"].isin(CURVE_FAMILIES)
    keep |= contrasts["step"] == contrasts.groupby(SERIES, dropna=False, sort=False)["step"].transform("max")
    for metric, layer, step in CONTRASTS_READ.get(folder, ()):
        keep |= ((contrasts["metric"] == metric) & ((contrasts["layer"] == layer) if layer else True)
                 & ((contrasts["step"] == step) if step is not None else True))
    return contrasts[keep]


#: The counts :func:`family_counts` writes: rows with each corrected (or raw) p below 0.05
FAMILY_COUNTS = {"p_holm_below_05": "p_holm", "q_bh_below_05": "q_bh", "p_below_05": "p_value"}


def family_counts(contrasts: pd.DataFrame) -> pd.DataFrame:
    """Per family and step of a full ``contrasts.csv``: its rows and those whose Holm p, BH q and raw p are below
    0.05 (NaN is not). Summed over the steps, a family's size and rejections as the aggregator corrected them; summed
    from a step on, those of its later rows (``lab.doc_table_reads.families_line``)."""
    below = pd.DataFrame({name: (contrasts[col] < 0.05).astype(int) for name, col in FAMILY_COUNTS.items()})
    frame = pd.concat([contrasts[["family", "step"]], below.assign(rows=1)], axis=1)
    counts = frame.groupby(["family", "step"], sort=True).sum().reset_index()
    return counts[["family", "step", "rows", *FAMILY_COUNTS]]


def write_xz(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as CSV in xz, in the aggregator's float format; the same bytes on every run (no timestamps)."""
    from outlierlab.studies.aggregate import CSV_FLOATS

    data = frame.to_csv(index=False, float_format=CSV_FLOATS).encode()
    path.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))


def write_contrasts(contrasts: pd.DataFrame | None, md: str, folder: str, out: Path) -> str:
    """Write the committed ``contrasts.csv.xz`` and ``families.csv.xz`` of a study's full ``contrasts`` (None: the
    study has none) into ``out``; return its ``study.md`` ``md`` with the last line saying what they hold."""
    if contrasts is None:
        return committed_md(md, folder)
    kept = committed_contrasts(contrasts, folder)
    write_xz(kept, out / "contrasts.csv.xz")
    write_xz(family_counts(contrasts), out / "families.csv.xz")
    return committed_md(md, folder, len(kept), len(contrasts))


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
        contrasts = pd.read_csv(fresh / "contrasts.csv") if (fresh / "contrasts.csv").is_file() else None
        (staged / "study.md").write_text(write_contrasts(contrasts, md, folder, staged))
        if folder in STUDY_CSV_READ and (fresh / "study.csv").is_file():
            write_xz(pd.read_csv(fresh / "study.csv"), staged / "study.csv.xz")
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
    """The pages holding a generated table block (``lab.doc_tables``)."""
    return sorted(p for p in docs.rglob("*.md") if "<!-- generated: " in p.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.committed",
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
    from lab import doc_tables

    return doc_tables.main([str(p) for p in generated_pages()])


if __name__ == "__main__":
    sys.exit(main())
