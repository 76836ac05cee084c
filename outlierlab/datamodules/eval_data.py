"""Loaders for the small real evaluation sets shipped in ``outlierlab/datamodules/data/eval/``.

Plain Python (gzip + json; no torch).  Contents, provenance and licences: ``data/eval/NOTICE.md``; builder:
``scripts/build_eval_data.py``.

- ``load_sentences`` — *Persuasion* sentences (anisotropy, self-similarity, outlier statistics, position probe;
  Ethayarajh 2019, Luo et al. 2021 §3, §4.1).
- ``load_wic`` — WiC-style pairs from WordNet examples (Pilehvar & Camacho-Collados 2019; Luo et al. §4.2).
- ``load_wordnet_pos`` — WordNet definitions labelled with part of speech, a 4-class stand-in for SST-2
  (Luo et al. §4.4).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

EVAL_DATA_DIR = Path(__file__).resolve().parent / "data" / "eval"
SENTENCES_FILE = "sentences.txt.gz"
WIC_FILE = "wic_wordnet.jsonl.gz"
POS_FILE = "wordnet_pos.jsonl.gz"

WIC_SPLITS = ("train", "dev", "test")
POS_SPLITS = ("train", "validation", "test")
POS_LABELS = ("noun", "verb", "adjective", "adverb")  # label int = index

_REBUILD = "rebuild the shipped sets with `python scripts/build_eval_data.py all` from the repository root"


def _resolve(path: str | Path | None, default_name: str) -> Path:
    p = EVAL_DATA_DIR / default_name if path is None else Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"evaluation data file {p} not found: {_REBUILD}, or pass an existing path")
    return p


def _check_split(split: str | None, valid: tuple[str, ...]) -> None:
    if split is not None and split not in valid:
        raise ValueError(f"unknown split {split!r}: choose one of {', '.join(valid)} (or None for all)")


def _read_jsonl(path: Path, split: str | None) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return rows if split is None else [r for r in rows if r["split"] == split]


def load_sentences(path: str | Path | None = None) -> list[str]:
    """Held-out English sentences (Austen, *Persuasion*); ``path``: a gzip text file, one per line (None: the shipped
    ``sentences.txt.gz``)."""
    with gzip.open(_resolve(path, SENTENCES_FILE), "rt", encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh if line.strip()]


def load_wic(path: str | Path | None = None, split: str | None = None) -> list[dict]:
    """WiC-style pairs: ``word, pos, sentence1, sentence2, start1, end1, start2, end2, label, synset1, synset2, split``;
    ``sentenceK[startK:endK]`` is the target (end exclusive), ``label`` True for the same WordNet synset. ``path``: gzip
    JSONL (None: the shipped file); ``split`` ("train", "dev", "test"; disjoint by lemma) or None: all."""
    _check_split(split, WIC_SPLITS)
    return _read_jsonl(_resolve(path, WIC_FILE), split)


def load_wordnet_pos(path: str | Path | None = None, split: str | None = None) -> list[dict]:
    """Definitions labelled with the defined word's part of speech: ``text, label`` (index into ``POS_LABELS``),
    ``label_name, split, synset``.  ``path``: gzip JSONL (None: shipped); ``split`` or None: all."""
    _check_split(split, POS_SPLITS)
    return _read_jsonl(_resolve(path, POS_FILE), split)
