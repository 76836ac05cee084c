#!/usr/bin/env python
"""Build ``data=english_large``: the largest real English text this project can assemble offline (~37 MB, 6.3M words).

Sources, all installed from Debian packages, never downloaded at run time:

* **GCIDE** -- the GNU Collaborative International Dictionary of English 0.48 (package ``dict-gcide``:
  ``apt-get install dict-gcide``), derived from Webster's Revised Unabridged Dictionary (1913): every entry's
  definitions, usage notes and quotations, one entry per document (~40 MB).  GPL-2-or-later (NOTICE.md).
  Entries that GCIDE took from WordNet 1.5 are DROPPED: WordNet is the source of this project's evaluation
  sets (WiC-style pairs, POS probes), and its glosses must not be pretraining text;
* **the full King James Bible** (``shared/data/corpora/kjv_verses.txt.gz``, from ``bible-kjv-text``; the
  embedded corpus has only its first five books), one verse per line;
* **Austen (five novels) and Moby Dick** exactly as in the embedded corpus (*Persuasion* stays held out).

Output (``--out``, default ``$OUTLIERLAB_CACHE/corpora/english_large`` or ``~/.cache/outlierlab/...``, where
``configs/data/english_large.yaml`` reads it): one ``.txt.gz`` per source, ``manifest.json`` and ``NOTICE.md``.
Deterministic bytes (gzip mtime 0); nothing here is committed to git.

Usage::

    apt-get install dict-gcide      # once
    python scripts/build_english_large.py [--gcide /usr/share/dictd] [--source ../shared/data] [--out DIR]
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_corpus import AUSTEN, DEFAULT_SOURCE, KJV_FIRST, KJV_SOURCE, MOBY_SOURCE, _gzip_bytes, _moby_dick, _read_lines  # noqa: E402

DEFAULT_GCIDE = Path("/usr/share/dictd")
DEFAULT_OUT = Path(os.environ.get("OUTLIERLAB_CACHE") or "~/.cache/outlierlab").expanduser() / "corpora" / "english_large"
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_PRONUNCIATION = re.compile(r"\\[^\\\n]*\\")            # \Ab`di*ca"tion\ -- GCIDE's pronunciation key
_SOURCE_TAG = re.compile(r"^\s*\[[^\[\]]*\]\s*$")        # a line that only names a source: [1913 Webster]
_WORDNET = re.compile(r"\[\s*WordNet", re.IGNORECASE)    # a sense taken from WordNet 1.5
_SPACE = re.compile(r"\s+")


def dictd_number(code: str) -> int:
    """Decode a dictd index number (big-endian base 64 with the alphabet ``A-Za-z0-9+/``)."""
    n = 0
    for ch in code:
        n = n * 64 + _B64.index(ch)
    return n


def gcide_documents(data: bytes, index: str) -> list[str]:
    """One cleaned document per dictionary entry of a dictd database (``.dict`` bytes, ``.index`` text).

    Entries are read in index order, each once (several headwords can point at one entry); the
    ``00-database-*`` header entries are skipped, and so is every entry that cites WordNet anywhere (its
    ``[WordNet 1.5]`` tag can follow a ``Syn:`` paragraph, so senses cannot be told apart reliably).  In the
    others, pronunciation keys and source-only lines (``[1913 Webster]``) are removed and the rest is joined
    into one line.
    """
    seen: set[int] = set()
    docs = []
    for line in index.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        start, length = dictd_number(parts[1]), dictd_number(parts[2])
        if start in seen:
            continue
        seen.add(start)
        raw = data[start:start + length]
        try:
            entry = raw.decode("utf-8")
        except UnicodeDecodeError:  # a few entries carry Windows-1252 quotes (0x92): read them as such
            entry = raw.decode("cp1252", errors="replace").replace("\ufffd", "")
        if _WORDNET.search(entry):  # its tag may sit after a "Syn:" paragraph: drop the whole entry
            continue
        lines = [l for l in entry.splitlines() if not _SOURCE_TAG.match(l)]
        text = _SPACE.sub(" ", _PRONUNCIATION.sub("", " ".join(lines))).strip()
        if len(text.split()) >= 3:  # a bare headword is not text
            docs.append(text)
    return docs


def build(gcide_dir: Path, source: Path) -> dict[str, bytes]:
    """``{file name: bytes}`` of the corpus files, manifest.json and NOTICE.md."""
    dz, idx = gcide_dir / "gcide.dict.dz", gcide_dir / "gcide.index"
    if not dz.is_file() or not idx.is_file():
        raise FileNotFoundError(f"GCIDE not found at {dz}; install it with `apt-get install dict-gcide` "
                                f"or pass --gcide DIR holding gcide.dict.dz and gcide.index")
    corpora = source / "corpora"
    if not corpora.is_dir():
        raise FileNotFoundError(f"no corpora/ folder under {source}; pass --source <shared data dir>")
    kjv = _read_lines(corpora / KJV_SOURCE)
    if kjv[0] != KJV_FIRST:
        raise RuntimeError(f"{corpora / KJV_SOURCE}: first verse is not Genesis 1:1")
    works = [("gcide", "dict-gcide 0.48 (/usr/share/dictd/gcide.dict.dz)",
              "GCIDE: Collaborative International Dictionary of English (Webster 1913 + additions), "
              "WordNet entries removed",
              gcide_documents(gzip.decompress(dz.read_bytes()), idx.read_text(encoding="utf-8")))]
    works.append(("kjv_bible", f"shared/data/corpora/{KJV_SOURCE}", "King James Bible, complete", kjv))
    for name, fname, title in AUSTEN:
        works.append((name, f"shared/data/corpora/{fname}", f"Jane Austen, {title}", _read_lines(corpora / fname)))
    works.append(("melville_moby_dick", f"shared/data/corpora/{MOBY_SOURCE}", "Herman Melville, Moby Dick (1851)",
                  _moby_dick(corpora / MOBY_SOURCE)))
    files: dict[str, bytes] = {}
    manifest = {"format": "one document per line, UTF-8, gzip", "files": []}
    for name, src, title, lines in works:
        text = "\n".join(lines) + "\n"
        files[f"{name}.txt.gz"] = _gzip_bytes(text)
        manifest["files"].append({"file": f"{name}.txt.gz", "title": title, "source": src, "lines": len(lines),
                                  "words": sum(len(l.split()) for l in lines),
                                  "bytes_uncompressed": len(text.encode("utf-8")),
                                  "sha256_uncompressed": hashlib.sha256(text.encode("utf-8")).hexdigest()})
    for key in ("lines", "words", "bytes_uncompressed"):
        manifest[f"total_{key}"] = sum(f[key] for f in manifest["files"])
    files["manifest.json"] = (json.dumps(manifest, indent=2) + "\n").encode("utf-8")
    table = "\n".join(f"| `{f['file']}` | {f['title']} | {f['lines']:,} | {f['words']:,} |" for f in manifest["files"])
    files["NOTICE.md"] = NOTICE.format(table=table, words=manifest["total_words"]).encode("utf-8")
    return files


NOTICE = """\
# english_large pretraining corpus: provenance and terms

Built by `scripts/build_english_large.py` (deterministic) from Debian packages installed on this machine.
One document per line, UTF-8, gzip.

| file | work | documents | words |
|---|---|---:|---:|
{table}

Total: {words:,} words.

## Terms

- **GCIDE** (`gcide.txt.gz`), from the Debian package `dict-gcide`: "GCIDE is free software; you can
  redistribute it and/or modify it under the terms of the GNU General Public License as published by the Free
  Software Foundation; either version 2, or (at your option) any later version." It derives from Webster's
  Revised Unabridged Dictionary (1913, public domain). Any copy of `gcide.txt.gz` is a modified version of
  GCIDE (markup, pronunciations and WordNet-derived entries removed) and is distributed under the GPL; the full
  terms are in `/usr/share/common-licenses/GPL-2` and `/usr/share/doc/dict-gcide/copyright`.
- **King James Bible**, from `bible-kjv-text` (text marked for unrestricted use; public domain in most
  countries, Crown rights in the United Kingdom).
- **Jane Austen** (five novels; *Persuasion* held out) and **Herman Melville, Moby Dick**: public domain; see
  `outlierlab/datamodules/data/corpus/NOTICE.md`.

No WordNet text is included: GCIDE entries citing WordNet are removed because WordNet is the source of this
project's evaluation sets.
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gcide", type=Path, default=DEFAULT_GCIDE, help="folder with gcide.dict.dz and gcide.index")
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="shared data dir holding corpora/")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (data=english_large reads it)")
    args = p.parse_args(argv)
    files = build(args.gcide, args.source)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (args.out / name).write_bytes(data)
    m = json.loads(files["manifest.json"])
    print(f"wrote {len(files)} files to {args.out}: {m['total_lines']:,} documents, {m['total_words']:,} words, "
          f"{m['total_bytes_uncompressed'] / 1e6:.1f} MB uncompressed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
