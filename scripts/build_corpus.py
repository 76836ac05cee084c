#!/usr/bin/env python
"""Rebuild the embedded pretraining corpus ``outlierlab/datamodules/data/corpus/`` from the shared raw text.

The corpus is real English, one document (paragraph or verse) per line, ~5.6 MB uncompressed:

* Jane Austen: five novels -- every novel in r-cran-janeaustenr EXCEPT *Persuasion*, which is held out
  for evaluation;
* Herman Melville, *Moby Dick* (Project Gutenberg #2701): only the book's own text -- the Gutenberg header,
  licence, producer credit and transcriber's note are dropped;
* King James Bible: the Pentateuch (Genesis to Deuteronomy, first line up to the verse before Joshua 1:1).

WordNet is deliberately NOT used (it is the source of evaluation sets).

Output: one ``<name>.txt.gz`` per work (gzip with mtime 0 and no file name, so the bytes are reproducible),
``manifest.json`` (order, line/byte counts, sha256 of the uncompressed text) and ``NOTICE.md`` (provenance and
terms).  Deterministic: running it twice gives identical bytes; ``--check`` verifies the shipped copy.

Usage::

    python scripts/build_corpus.py [--source ../shared/data] [--out outlierlab/datamodules/data/corpus] [--check]
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "outlierlab" / "datamodules" / "data" / "corpus"
DEFAULT_SOURCE = Path(os.environ.get("OUTLIERLAB_SOURCE_DATA", REPO.parent / "shared" / "data"))

# (output name, source file, title) -- the order here is the document order of the corpus.
AUSTEN = [
    ("austen_sense_and_sensibility", "janeaustenr__sensesensibility.txt.gz", "Sense and Sensibility (1811)"),
    ("austen_pride_and_prejudice", "janeaustenr__prideprejudice.txt.gz", "Pride and Prejudice (1813)"),
    ("austen_mansfield_park", "janeaustenr__mansfieldpark.txt.gz", "Mansfield Park (1814)"),
    ("austen_emma", "janeaustenr__emma.txt.gz", "Emma (1815)"),
    ("austen_northanger_abbey", "janeaustenr__northangerabbey.txt.gz", "Northanger Abbey (1817)"),
]
HELD_OUT = {"janeaustenr__persuasion.txt.gz"}  # evaluation text of a colleague: never embed it
MOBY_SOURCE = "tokenizers__mobydick.txt.gz"
# Lines inside the Gutenberg START/END markers that are not Melville's text.
MOBY_DROP_PREFIXES = ("Produced by ", "This text is a combination of etexts", "In chapters 24, 89, and 90, we substituted")
KJV_SOURCE = "kjv_verses.txt.gz"
KJV_FIRST = "In the beginning God created the heaven and the earth."  # Genesis 1:1
KJV_STOP = "Now after the death of Moses the servant of the LORD it came to pass"  # Joshua 1:1 (excluded)


def _read_lines(path: Path) -> list[str]:
    """Non-empty, stripped lines of a gzip UTF-8 file (BOM removed)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.replace("\ufeff", "").strip() for line in f]
    return [line for line in lines if line]


def _moby_dick(path: Path) -> list[str]:
    lines = _read_lines(path)
    start = next(i for i, l in enumerate(lines) if l.startswith("*** START OF THIS PROJECT GUTENBERG EBOOK"))
    end = next(i for i, l in enumerate(lines) if l.startswith("End of Project Gutenberg's Moby Dick"))
    body = [l for l in lines[start + 1 : end] if not l.startswith(MOBY_DROP_PREFIXES)]
    if any("gutenberg" in l.lower() for l in body):
        raise RuntimeError("Moby Dick body still mentions Project Gutenberg; update MOBY_DROP_PREFIXES")
    return body


def _kjv_pentateuch(path: Path) -> list[str]:
    lines = _read_lines(path)
    if lines[0] != KJV_FIRST:
        raise RuntimeError(f"{path}: first verse is not Genesis 1:1")
    stop = next(i for i, l in enumerate(lines) if l.startswith(KJV_STOP))
    return lines[:stop]


def _gzip_bytes(text: str) -> bytes:
    buf = io.BytesIO()
    # mtime=0 and an empty file name make the gzip header, hence the bytes, reproducible.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as f:
        f.write(text.encode("utf-8"))
    return buf.getvalue()


def build(source: Path) -> dict[str, bytes]:
    """Return ``{file name: bytes}`` of the corpus files, manifest.json and NOTICE.md built from ``source``."""
    corpora = source / "corpora"
    if not corpora.is_dir():
        raise FileNotFoundError(f"no corpora/ folder under {source}; pass --source <shared data dir>")
    works: list[tuple[str, str, str, list[str]]] = []
    for name, fname, title in AUSTEN:
        assert fname not in HELD_OUT
        works.append((name, fname, f"Jane Austen, {title}", _read_lines(corpora / fname)))
    works.append(("melville_moby_dick", MOBY_SOURCE, "Herman Melville, Moby Dick; or The Whale (1851)",
                  _moby_dick(corpora / MOBY_SOURCE)))
    works.append(("kjv_pentateuch", KJV_SOURCE, "King James Bible (1611/1769), Genesis to Deuteronomy",
                  _kjv_pentateuch(corpora / KJV_SOURCE)))

    files: dict[str, bytes] = {}
    manifest = {"format": "one document (paragraph or verse) per line, UTF-8, gzip", "files": []}
    for name, fname, title, lines in works:
        text = "\n".join(lines) + "\n"
        files[f"{name}.txt.gz"] = _gzip_bytes(text)
        manifest["files"].append({
            "file": f"{name}.txt.gz", "title": title, "source": f"shared/data/corpora/{fname}",
            "lines": len(lines), "bytes_uncompressed": len(text.encode("utf-8")),
            "sha256_uncompressed": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        })
    manifest["total_lines"] = sum(f["lines"] for f in manifest["files"])
    manifest["total_bytes_uncompressed"] = sum(f["bytes_uncompressed"] for f in manifest["files"])
    files["manifest.json"] = (json.dumps(manifest, indent=2) + "\n").encode("utf-8")
    files["NOTICE.md"] = NOTICE.format(
        table="\n".join(f"| `{f['file']}` | {f['title']} | {f['lines']:,} | {f['bytes_uncompressed']:,} |"
                        for f in manifest["files"]),
        total_lines=manifest["total_lines"], total_bytes=manifest["total_bytes_uncompressed"],
    ).encode("utf-8")
    return files


NOTICE = """\
# Embedded pretraining corpus: provenance and terms

Built by `scripts/build_corpus.py` (deterministic) from the shared raw text (`shared/data/corpora`, taken
offline from Debian packages; see its PROVENANCE.md). One document (paragraph or verse) per line, UTF-8, gzip.

| file | work | lines | bytes (uncompressed) |
|---|---|---:|---:|
{table}

Total: {total_lines:,} lines, {total_bytes:,} bytes uncompressed.

## Sources and terms

- **Jane Austen** (five novels) -- from the Debian package `r-cran-janeaustenr` 1.0.0 (R package janeaustenr by
  Julia Silge, MIT licence; text from Project Gutenberg). The novels are in the public domain.
  *Persuasion* is deliberately excluded: it is held out for evaluation.
- **Herman Melville, Moby Dick** -- from the Debian package `r-cran-tokenizers` (R package tokenizers, MIT
  licence), which ships Project Gutenberg eBook #2701. The novel is in the public domain. The Project Gutenberg
  header, licence, producer credit and transcriber's note were removed, so this copy carries no Project
  Gutenberg trademark and is not distributed under the Project Gutenberg licence.
- **King James Bible**, Genesis to Deuteronomy -- from the Debian package `bible-kjv-text` (text marked for
  unrestricted use). The text is in the public domain in most countries; in the United Kingdom the Crown's
  rights in the Authorized Version are administered under Letters Patent.

WordNet data is NOT part of this corpus (it is used for evaluation sets elsewhere in the project).
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="shared data dir holding corpora/")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    p.add_argument("--check", action="store_true", help="verify --out matches a rebuild; write nothing")
    args = p.parse_args(argv)
    files = build(args.source)
    if args.check:
        bad = [n for n, b in files.items() if not (args.out / n).is_file() or (args.out / n).read_bytes() != b]
        print("corpus up to date" if not bad else f"corpus differs from a rebuild: {', '.join(bad)}")
        return 1 if bad else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (args.out / name).write_bytes(data)
    manifest = json.loads(files["manifest.json"])
    print(f"wrote {len(files)} files to {args.out}: {manifest['total_lines']:,} lines, "
          f"{manifest['total_bytes_uncompressed'] / 1e6:.2f} MB uncompressed, "
          f"{sum(len(b) for n, b in files.items() if n.endswith('.gz')) / 1e6:.2f} MB gzip")
    return 0


if __name__ == "__main__":
    sys.exit(main())
