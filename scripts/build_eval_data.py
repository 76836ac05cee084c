#!/usr/bin/env python
"""Build the small real evaluation sets shipped in ``outlierlab/datamodules/data/eval/``.

Every set comes from text that is NOT in the pretraining corpus (Austen's other five novels,
*Moby Dick*, KJV), so that probing/evaluation measures held-out text:

``sentences.txt.gz``
    Sentences of Austen's *Persuasion*, one per line, for outlier statistics, anisotropy and
    self-similarity (Ethayarajh 2019; Luo et al. 2021 §4.1) and the position probe (Luo et al. §3).
``wic_wordnet.jsonl.gz``
    A Word-in-Context-style set (Pilehvar & Camacho-Collados 2019 format) built from WordNet 3.0
    example sentences, with identical target surface forms in both sentences (Luo et al. §4.2).
``wordnet_pos.jsonl.gz``
    WordNet definitions labelled with the part of speech of the defined synset: a small real
    4-class set for the linear-classifier probe (stand-in for SST-2/IMDB, Luo et al. §4.4).

Usage (from the repository root)::

    python scripts/build_eval_data.py all            # build the three sets + NOTICE.md + licence
    python scripts/build_eval_data.py wic --source ../shared/data --out /tmp/eval

The output is byte-for-byte deterministic: seeded RNGs (string seeds, independent of
PYTHONHASHSEED), sorted iteration, and gzip headers written with ``mtime=0``.
NOTICE.md is regenerated from the files present in ``--out`` after every subcommand, so its
counts always describe the shipped files.

Everything is written by hand (regex tokeniser, sentence splitter, pair sampler): no library
ships a WordNet-examples WiC builder or a sentence splitter we may use offline without a model.
This file is the command line; each set's rules live in ``scripts/eval_sets/`` (one module per set,
plus ``common`` and ``notice``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# The parts live in scripts/eval_sets/; scripts/ is not a package, and the tests load this file by path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_sets.common import (  # noqa: E402
    DEFAULT_OUT, DEFAULT_SEED, LICENSE_WORDNET, POS_FILE, SENTENCES_FILE, WIC_FILE, default_source,
    read_paragraphs, read_synsets, source_file, write_jsonl_gz, write_lines_gz,
)
from eval_sets.notice import write_notice  # noqa: E402
from eval_sets.sentences import build_sentences, word_sentence_freq  # noqa: E402
from eval_sets.wic import build_wic  # noqa: E402
from eval_sets.wordnet_pos import build_wordnet_pos  # noqa: E402


def build(what: str, source: Path, out: Path, seed: int = DEFAULT_SEED) -> dict:
    """Build ``what`` (sentences | wic | pos | all) from ``source`` into ``out``; returns stats."""
    out.mkdir(parents=True, exist_ok=True)
    stats: dict = {}
    if what in ("sentences", "all"):
        sents = build_sentences(read_paragraphs(source))
        write_lines_gz(sents, out / SENTENCES_FILE)
        freq = word_sentence_freq(sents)
        stats["sentences"] = {"n": len(sents), "types_ge10": sum(c >= 10 for c in freq.values())}
    synsets = read_synsets(source) if what in ("wic", "pos", "all") else None
    if what in ("wic", "all"):
        recs = build_wic(synsets, seed=seed)
        write_jsonl_gz(recs, out / WIC_FILE)
        stats["wic"] = dict(Counter(f"{r['split']}/{'pos' if r['label'] else 'neg'}" for r in recs))
    if what in ("pos", "all"):
        recs = build_wordnet_pos(synsets, seed=seed)
        write_jsonl_gz(recs, out / POS_FILE)
        stats["pos"] = dict(Counter(f"{r['split']}/{r['label_name']}" for r in recs))
    if what in ("wic", "pos", "all"):
        shutil.copyfile(source_file(source, LICENSE_WORDNET), out / LICENSE_WORDNET)
    write_notice(out, source, seed)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="?", default="all", choices=["sentences", "wic", "pos", "all"])
    p.add_argument("--source", type=Path, default=None,
                   help="shared data folder holding corpora/ (default $OUTLIERLAB_SHARED_DATA or ../shared/data)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = p.parse_args(argv)
    source = args.source or default_source()
    try:
        stats = build(args.what, source, args.out, args.seed)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(stats, indent=1, sort_keys=True))
    print(f"wrote {args.out} (see NOTICE.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
