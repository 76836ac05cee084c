"""A study's run directories as one compressed table: what docs/ keeps instead of the directories themselves.

    python -m outlierlab.studies.table pack docs/order_use/cells docs/order_use/cells.parquet
    python -m outlierlab.studies.aggregate docs/order_use/cells.parquet --contrast pos=learned,none    # as from the folder

One Parquet table (Brotli, ``COMPRESSION``) per study, one row per file of every cell that the readers use (``KEEP``:
the resolved config, overrides, manifest, markers and every CSV), columns ``cell`` (the run directory's name), ``file``
(its path in the cell) and ``text``; no checkpoint, figure, event file or model.  A machine's absolute paths are
replaced by ``<local>/<last component>`` (``scrub``), and the manifest's size and hash of each file so rewritten are
updated and listed under ``"scrubbed"``, so ``outlierlab.jobs.run_state.verify_manifest`` still checks every byte.

Every reader of run directories takes the table in their place (``resolve``): it is extracted once into
``$OUTLIERLAB_CACHE/studies/<hash>/`` and that folder handed to the unchanged readers, so the numbers are the run
directories' by construction (docs/studies.md).  For one's own analysis:

    import pandas as pd
    files = pd.read_parquet("docs/order_use/cells.parquet")           # cell, file, text
    ol.study_histories("docs/order_use/cells.parquet")                 # the monitors' rows of every cell, tidy

Written by hand: a folder tree in a table is a few lines of pandas, and no library packs Hydra run directories.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

SUFFIX = ".parquet"
#: How a table is compressed: Brotli at its highest level holds these CSV texts in 9 % fewer bytes than zstd at 19
#: (docs/studies.md, "What docs/ weighs"), the same texts byte for byte.
COMPRESSION = {"compression": "brotli", "compression_level": 11}
#: Files a reader uses (the rest of a run directory -- checkpoints, exports, figures, events -- stays out).
KEEP = re.compile(r"(^|/)(config\.yaml|overrides\.yaml|manifest\.json|finished\.json|failed\.json|code_versions\.jsonl|"
                  r"results\.json|[^/]+\.csv)$")
#: A machine's absolute path: a root folder of the usual mounts, then anything up to a quote, space or bracket.
ABSOLUTE_PATH = re.compile(r"(?<![\w.<>/-])/(?:work|home|root|tmp|Users|private|scratch|mnt|data|var|opt|srv|gpfs|"
                           r"lustre|shared)(?:/[^\s'\",\]\}\)]*)?")


def scrub(text: str) -> str:
    """``text`` with every absolute machine path replaced by ``<local>/<its last component>``."""
    return ABSOLUTE_PATH.sub(lambda m: "<local>/" + Path(m.group(0)).name, text)


def is_cell(path: Path) -> bool:
    """A run directory of a study: Hydra's ``.hydra/overrides.yaml`` or a train.py ``finished.json``."""
    return (path / ".hydra" / "overrides.yaml").is_file() or (path / "finished.json").is_file()


def _cell_dirs(folder: Path) -> list[Path]:
    return sorted({p.parent.parent if p.parent.name == ".hydra" else p.parent
                   for p in folder.rglob("*") if p.name in ("overrides.yaml", "finished.json")
                   and is_cell(p.parent.parent if p.parent.name == ".hydra" else p.parent)})


def pack(folder: str | Path, out: str | Path) -> pd.DataFrame:
    """Pack every run directory under ``folder`` into the table ``out``; returns the table."""
    from outlierlab.jobs.run_state import MANIFEST, describe_file

    folder, out = Path(folder), Path(out)
    cells = _cell_dirs(folder)
    if not cells:
        raise ValueError(f"no run directories (.hydra/overrides.yaml or finished.json) under {folder}")
    out.parent.mkdir(parents=True, exist_ok=True)  # before the scrubbed files' hashes are staged there
    rows = []
    for cell in cells:
        name = cell.relative_to(folder).as_posix() if cell != folder else cell.name
        texts, scrubbed = {}, []
        for f in sorted(p for p in cell.rglob("*") if p.is_file()):
            rel = f.relative_to(cell).as_posix()
            if not KEEP.search(rel) or ".partial-" in rel:
                continue
            raw = f.read_bytes().decode("utf-8")  # bytes as they are: CSV writers end lines with \r\n
            texts[rel] = scrub(raw)
            if texts[rel] != raw and rel != MANIFEST:
                scrubbed.append(rel)
        if MANIFEST in texts:
            manifest = json.loads(texts[MANIFEST])
            files = manifest.get("files") or {}
            tmp = out.parent / f".{out.name}.describe-{os.getpid()}"
            try:
                for rel in scrubbed:
                    if rel in files:  # the hash of the bytes the table holds
                        tmp.write_bytes(texts[rel].encode("utf-8"))
                        files[rel] = describe_file(tmp)
            finally:
                tmp.unlink(missing_ok=True)
            manifest["scrubbed"] = sorted(set(scrubbed) & set(files))
            texts[MANIFEST] = json.dumps(manifest, indent=1)
        rows += [{"cell": name, "file": rel, "text": text} for rel, text in texts.items()]
    table = pd.DataFrame(rows, columns=["cell", "file", "text"])
    from outlierlab.utils.atomic import write_atomic

    write_atomic(out, table_bytes(table))
    return table


def table_bytes(table: pd.DataFrame) -> bytes:
    """``table`` (``cell, file, text``) as the bytes of a study table: Parquet, ``COMPRESSION``."""
    buf = io.BytesIO()
    table.to_parquet(buf, index=False, **COMPRESSION)
    return buf.getvalue()


def cells_dir(table: str | Path) -> Path:
    """The folder of run directories a packed study unpacks to (once per table content; read-only use)."""
    table = Path(table)
    if not table.is_file():
        raise FileNotFoundError(f"study table {table} not found")
    digest = hashlib.sha256(table.read_bytes()).hexdigest()[:16]
    # named as the folder it was packed from: readers that print a cell's folder print the same name
    cache = Path(os.environ.get("OUTLIERLAB_CACHE", "~/.cache/outlierlab")).expanduser()
    root = cache / "studies" / digest / table.stem
    if (root / ".complete").is_file():
        return root
    frame = pd.read_parquet(table)
    if list(frame.columns) != ["cell", "file", "text"]:
        raise ValueError(f"{table} is not a study table (columns cell, file, text; made by "
                         "python -m outlierlab.studies.table pack)")
    staging = root.with_name(f".{root.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    for cell, file, text in frame.itertuples(index=False):
        path = staging / cell / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    (staging / ".complete").write_text(str(table))
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(staging, root)
    except OSError:  # another process unpacked it first
        shutil.rmtree(staging, ignore_errors=True)
    return root


def resolve(path: str | Path) -> Path:
    """``path`` itself, or the unpacked folder when it is a study table (``cells.parquet``), or one of its cells
    (``cells.parquet/pos=none,seed=2``)."""
    text = str(path)
    if text.endswith(SUFFIX):
        return cells_dir(text)
    if SUFFIX + "/" in text:
        table, _, cell = text.partition(SUFFIX + "/")
        return cells_dir(table + SUFFIX) / cell
    return Path(path)


def study_histories(table: str | Path, file: str = "monitor/hidden_states.csv") -> pd.DataFrame:
    """The rows of one CSV of every cell of a packed study, tidy: a ``cell`` column, then the CSV's own columns
    (for the monitors' histories: ``step, name, statistic, dim, value``)."""
    if not isinstance(table, (str, os.PathLike)):
        raise TypeError(f"table={table!r}: pass the path of a packed study (a cells.parquet)")
    if not Path(table).expanduser().exists():  # pyarrow's own message is the bare path
        raise FileNotFoundError(f"no packed study at {table}: pass a cells.parquet written by "
                                "`python -m outlierlab.studies.table pack FOLDER OUT`")
    frame = pd.read_parquet(Path(table).expanduser())
    parts = [pd.read_csv(io.StringIO(text)).assign(cell=cell) for cell, f, text in frame.itertuples(index=False)
             if f == file]
    if not parts:
        raise ValueError(f"no cell of {table} has {file}; its files: {sorted(set(frame['file']))[:12]}")
    out = pd.concat(parts, ignore_index=True)
    return out[["cell", *[c for c in out.columns if c != "cell"]]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m outlierlab.studies.table", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="pack the run directories under FOLDER into the table OUT")
    p.add_argument("folder")
    p.add_argument("out")
    args = parser.parse_args(argv)
    try:
        table = pack(args.folder, args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {table['cell'].nunique()} cells, {len(table)} files, "
          f"{Path(args.out).stat().st_size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
