"""Source paths, output file names, the word rule and deterministic readers/writers shared by every set.

The output is byte-for-byte deterministic: gzip headers are written with ``mtime=0`` and no file name,
and JSON keys are sorted.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "outlierlab" / "datamodules" / "data" / "eval"
DEFAULT_SEED = 0

PERSUASION = "corpora/janeaustenr__persuasion.txt.gz"
SYNSETS = "corpora/wordnet_synsets.jsonl.gz"
LICENSE_WORDNET = "LICENSE.wordnet"

SENTENCES_FILE = "sentences.txt.gz"
WIC_FILE = "wic_wordnet.jsonl.gz"
POS_FILE = "wordnet_pos.jsonl.gz"

#: A word: letters/digits, with inner apostrophes or single hyphens ("don't", "well-known").
#: "--" (Austen's dash) is not a word character, so "way--she" counts as two words.
WORD_RE = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")


def default_source() -> Path:
    """``$OUTLIERLAB_SHARED_DATA`` if set, else ``../shared/data`` beside the repository (pass ``--source`` for
    another place)."""
    import os

    return Path(os.environ.get("OUTLIERLAB_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data")


def count_words(sentence: str) -> int:
    """Number of :data:`WORD_RE` words (punctuation and ``--`` are not words)."""
    return len(WORD_RE.findall(sentence))


def source_file(source: Path, rel: str) -> Path:
    """``source / rel``, or a FileNotFoundError that says to pass ``--source``."""
    path = Path(source) / rel
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: pass --source pointing at the shared data folder (holding corpora/)"
        )
    return path


def read_paragraphs(source: Path) -> list[str]:
    """Lines of *Persuasion* (one paragraph per line in r-cran-janeaustenr)."""
    with gzip.open(source_file(source, PERSUASION), "rt", encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh]


def read_synsets(source: Path) -> list[dict]:
    """WordNet 3.0 synsets: dicts with ``id``, ``pos``, ``lemmas``, ``definition``, ``examples``."""
    with gzip.open(source_file(source, SYNSETS), "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_jsonl_gz(path: Path) -> list[dict]:
    """Records of a gzip-compressed JSONL file (blank lines skipped)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _gz_bytes(text: str) -> bytes:
    """Gzip ``text`` with a fixed header (mtime 0, no file name) so builds are byte-identical."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(text.encode("utf-8"))
    return buf.getvalue()


def write_lines_gz(lines: Iterable[str], path: Path) -> None:
    Path(path).write_bytes(_gz_bytes("".join(line + "\n" for line in lines)))


def write_jsonl_gz(records: Iterable[dict], path: Path) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
    Path(path).write_bytes(_gz_bytes(text))
