"""Loaders for the small real evaluation sets shipped in ``outlierlab/datamodules/data/eval/``.

Plain Python (gzip + json only; no torch), so probe.py/evaluate.py can validate data before heavy
imports. What each file holds, how it was built, counts and licence terms: ``data/eval/NOTICE.md``;
the builder is ``scripts/build_eval_data.py``.

- ``load_sentences`` — *Persuasion* sentences (anisotropy, self-similarity, outlier statistics,
  position probe; Ethayarajh 2019, Luo et al. 2021 §3, §4.1).
- ``load_wic`` — WiC-style pairs from WordNet examples with identical target forms
  (Pilehvar & Camacho-Collados 2019; Luo et al. §4.2).
- ``load_wordnet_pos`` — WordNet definitions labelled with their part of speech, a 4-class
  set for the linear-classifier probe (stand-in for SST-2, Luo et al. §4.4).
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
    """Held-out English sentences (Austen, *Persuasion*), one string per sentence.

    Parameters
    ----------
    path : str or Path, optional
        A gzip text file with one sentence per line; ``None`` = the shipped ``sentences.txt.gz``.
    """
    with gzip.open(_resolve(path, SENTENCES_FILE), "rt", encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh if line.strip()]


def load_wic(path: str | Path | None = None, split: str | None = None) -> list[dict]:
    """WiC-style pairs: ``word, pos, sentence1, sentence2, start1, end1, start2, end2, label,
    synset1, synset2, split``; ``sentenceK[startK:endK]`` is the target token (end exclusive)
    and ``label`` is True when both occurrences belong to the same WordNet synset.

    Parameters
    ----------
    path : str or Path, optional
        A gzip JSONL file; ``None`` = the shipped ``wic_wordnet.jsonl.gz``.
    split : {"train", "dev", "test"}, optional
        Keep only this split (splits are disjoint by lemma); ``None`` = all rows.
    """
    _check_split(split, WIC_SPLITS)
    return _read_jsonl(_resolve(path, WIC_FILE), split)


def load_wordnet_pos(path: str | Path | None = None, split: str | None = None) -> list[dict]:
    """Definitions labelled with the part of speech of the defined word: ``text, label (int,
    index into POS_LABELS), label_name, split, synset``.

    Parameters
    ----------
    path : str or Path, optional
        A gzip JSONL file; ``None`` = the shipped ``wordnet_pos.jsonl.gz``.
    split : {"train", "validation", "test"}, optional
        Keep only this split; ``None`` = all rows.
    """
    _check_split(split, POS_SPLITS)
    return _read_jsonl(_resolve(path, POS_FILE), split)
