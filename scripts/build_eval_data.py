#!/usr/bin/env python
"""Build the small real evaluation sets shipped in ``datamodules/data/eval/``.

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
    python scripts/build_eval_data.py wic --source /work/shared/data --out /tmp/eval

The output is byte-for-byte deterministic: seeded RNGs (string seeds, independent of
PYTHONHASHSEED), sorted iteration, and gzip headers written with ``mtime=0``.
NOTICE.md is regenerated from the files present in ``--out`` after every subcommand, so its
counts always describe the shipped files.

Everything here is written by hand (regex tokeniser, sentence splitter, pair sampler): no library
ships a WordNet-examples WiC builder or a sentence splitter we may use offline without a model.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import itertools
import json
import random
import re
import shutil
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "datamodules" / "data" / "eval"
DEFAULT_SEED = 0

PERSUASION = "corpora/janeaustenr__persuasion.txt.gz"
SYNSETS = "corpora/wordnet_synsets.jsonl.gz"
LICENSE_WORDNET = "LICENSE.wordnet"

SENTENCES_FILE = "sentences.txt.gz"
WIC_FILE = "wic_wordnet.jsonl.gz"
POS_FILE = "wordnet_pos.jsonl.gz"

# ----------------------------------------------------------------------------- shared helpers

#: A word: letters/digits, with inner apostrophes or single hyphens ("don't", "well-known").
#: "--" (Austen's dash) is not a word character, so "way--she" counts as two words.
WORD_RE = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")


def default_source() -> Path:
    """``../shared/data`` beside the repository if present, else ``/work/shared/data``."""
    beside = REPO_ROOT.parent / "shared" / "data"
    return beside if beside.is_dir() else Path("/work/shared/data")


def count_words(sentence: str) -> int:
    """Number of :data:`WORD_RE` words (punctuation and ``--`` are not words)."""
    return len(WORD_RE.findall(sentence))


def _open_source(source: Path, rel: str) -> Path:
    path = Path(source) / rel
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: pass --source pointing at the shared data folder (holding corpora/)"
        )
    return path


def read_paragraphs(source: Path) -> list[str]:
    """Lines of *Persuasion* (one paragraph per line in r-cran-janeaustenr)."""
    with gzip.open(_open_source(source, PERSUASION), "rt", encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh]


def read_synsets(source: Path) -> list[dict]:
    """WordNet 3.0 synsets: dicts with ``id``, ``pos``, ``lemmas``, ``definition``, ``examples``."""
    with gzip.open(_open_source(source, SYNSETS), "rt", encoding="utf-8") as fh:
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


def _unit_hash(key: str) -> float:
    """Deterministic number in [0, 1) from a string (stable across processes and slices)."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:15], 16) / 16**15


# ----------------------------------------------------------------------------- 1. sentences

SENT_MIN_WORDS, SENT_MAX_WORDS = 8, 60
#: Abbreviations that end in "." without ending a sentence in Persuasion ("Charles Musgrove, Esq. of").
ABBREVIATIONS = frozenset({"Mr", "Mrs", "Dr", "St", "Esq", "Wm", "Capt", "Col"})
# Sentence end: run of . ! ? plus closing quotes/brackets, then whitespace, then (after an optional
# opening quote/bracket) an upper-case letter. "Indeed!" was the reply -> no split (lower case next).
_BOUNDARY = re.compile(r"([.!?]+[\"'’”)\]]*)\s+(?=[\"'‘“(\[]?[A-Z])")
_LAST_WORD = re.compile(r"([A-Za-z]+)\.$")


def split_sentences(paragraph: str) -> list[str]:
    """Split one paragraph into sentences with a simple punctuation rule.

    A sentence ends at ``.``/``!``/``?`` (plus any closing quote or bracket) followed by whitespace
    and an upper-case letter (optionally after an opening quote); a ``.`` after one of
    :data:`ABBREVIATIONS` does not end a sentence. Whitespace inside a sentence is collapsed.
    """
    paragraph = " ".join(paragraph.split())
    out, start = [], 0
    for m in _BOUNDARY.finditer(paragraph):
        head = paragraph[start : m.end(1)]
        last = _LAST_WORD.search(head)
        if m.group(1).startswith(".") and last and last.group(1) in ABBREVIATIONS:
            continue
        out.append(head.strip())
        start = m.end()
    tail = paragraph[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


def build_sentences(
    paragraphs: Sequence[str], min_words: int = SENT_MIN_WORDS, max_words: int = SENT_MAX_WORDS
) -> list[str]:
    """Sentences of ``paragraphs`` with ``min_words <= count_words <= max_words``, in text order,
    exact duplicates removed (first occurrence kept)."""
    seen: set[str] = set()
    out = []
    for para in paragraphs:
        for sent in split_sentences(para):
            if min_words <= count_words(sent) <= max_words and sent not in seen:
                seen.add(sent)
                out.append(sent)
    return out


def word_sentence_freq(sentences: Sequence[str]) -> Counter:
    """For each lower-cased word type, the number of sentences it occurs in."""
    return Counter(w for s in sentences for w in {t.lower() for t in WORD_RE.findall(s)})


# ----------------------------------------------------------------------------- 2. WiC

WIC_CAP_PER_LEMMA = 3  # at most this many positives AND this many negatives per (lemma, pos)
WIC_SPLIT_FRACTIONS = (("train", 0.7), ("dev", 0.1), ("test", 0.2))  # by lemma (hash of lemma)
WIC_POS = {"n": "N", "v": "V", "a": "A", "s": "A", "r": "R"}
_LEMMA_RE = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")  # single-word lemmas only (no '_' phrases)
_TARGET_RE = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")  # candidate target tokens in an example
_VOWELS = "aeiou"


def surface_forms(lemma: str, pos: str) -> set[str]:
    """Lower-cased forms under which ``lemma`` is searched in its synset's example sentences.

    The lemma itself plus regular English inflections (nouns: -s/-es/-ies; verbs: -s/-es/-ed/-d/
    -ing, e-drop, y->ied/ies, final-consonant doubling; adjectives: -er/-est). Irregular forms are
    simply missed. Pairs keep identical forms only, so an over-generated form can never make the
    two targets differ.
    """
    lem = lemma.lower()
    forms = {lem}
    y_stem = lem[:-1] if lem.endswith("y") and len(lem) > 2 and lem[-2] not in _VOWELS else None
    if pos == "n":
        forms |= {lem + "s", lem + "es"}
        if y_stem:
            forms.add(y_stem + "ies")
    elif pos == "v":
        forms |= {lem + "s", lem + "es", lem + "ed", lem + "d", lem + "ing"}
        if lem.endswith("e") and len(lem) > 2:
            forms.add(lem[:-1] + "ing")
        if y_stem:
            forms |= {y_stem + "ies", y_stem + "ied"}
        if (len(lem) > 2 and lem[-1] not in _VOWELS + "wxy" and lem[-2] in _VOWELS
                and lem[-3] not in _VOWELS):
            forms |= {lem + lem[-1] + "ed", lem + lem[-1] + "ing"}
    elif pos in ("a", "s"):
        forms |= {lem + "er", lem + "est", lem + "r", lem + "st"}
        if y_stem:
            forms |= {y_stem + "ier", y_stem + "iest"}
    return forms


def find_target(sentence: str, forms: set[str]) -> tuple[int, int] | None:
    """Character span ``(start, end)`` (end exclusive) of the single token of ``sentence`` whose
    lower-cased form is in ``forms``; ``None`` if there is no such token or more than one
    (an ambiguous target is skipped rather than guessed)."""
    hits = [m.span() for m in _TARGET_RE.finditer(sentence) if m.group(0).lower() in forms]
    return hits[0] if len(hits) == 1 else None


def collect_occurrences(synsets: Iterable[dict]) -> dict:
    """``{(lemma, pos): {form: {synset_id: [(sentence, start, end), ...]}}}`` over all examples
    in which a single-word lemma of the synset occurs exactly once. The lemma is lower-cased and
    searched case-insensitively; ``form`` is the matched token exactly as written (case kept)."""
    occ: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for syn in synsets:
        pos = syn["pos"]
        lemmas = sorted({lem.lower() for lem in syn["lemmas"] if _LEMMA_RE.fullmatch(lem)})
        for example in syn["examples"]:
            sentence = " ".join(example.split())
            for lem in lemmas:
                span = find_target(sentence, surface_forms(lem, pos))
                if span is None:
                    continue
                form = sentence[span[0] : span[1]]  # exact string: case must match too
                slot = occ[(lem, WIC_POS[pos])][form][syn["id"]]
                if all(s != sentence for s, _, _ in slot):
                    slot.append((sentence, *span))
    return occ


def wic_split(lemma: str, seed: int = DEFAULT_SEED) -> str:
    """Split of a lemma (all its pairs, every POS): hash-based so no lemma crosses splits."""
    u, acc = _unit_hash(f"{seed}:wic-split:{lemma}"), 0.0
    for name, frac in WIC_SPLIT_FRACTIONS:
        acc += frac
        if u < acc:
            return name
    return WIC_SPLIT_FRACTIONS[-1][0]


def _pair(lemma, pos, syn1, occ1, syn2, occ2, label, split, rng) -> dict:
    if rng.random() < 0.5:  # random order so sentence1 is not always the "first" synset
        syn1, occ1, syn2, occ2 = syn2, occ2, syn1, occ1
    return {
        "word": lemma, "pos": pos, "label": label, "split": split,
        "sentence1": occ1[0], "start1": occ1[1], "end1": occ1[2], "synset1": syn1,
        "sentence2": occ2[0], "start2": occ2[1], "end2": occ2[2], "synset2": syn2,
    }


def build_wic(
    synsets: Iterable[dict], seed: int = DEFAULT_SEED, cap_per_lemma: int = WIC_CAP_PER_LEMMA
) -> list[dict]:
    """WiC-style pairs from WordNet example sentences (format of Pilehvar & Camacho-Collados 2019).

    For each (lemma, POS), candidates are built within one surface form (so both targets are the
    identical string, case included): a positive takes two different example sentences of the
    same synset, a negative one example sentence from each of two different synsets; at most one
    candidate per (lemma, synset pair). Then ``m = min(#pos, #neg, cap_per_lemma)`` of each are drawn,
    so every lemma contributes as many positives as negatives: the set is 50/50 overall, per split
    and per lemma (lemma identity carries no label information). Splits are assigned by lemma.
    """
    occ = collect_occurrences(synsets)
    records = []
    for (lemma, pos) in sorted(occ):
        rng = random.Random(f"{seed}:wic:{lemma}:{pos}")
        pos_c: dict = {}
        neg_c: dict = {}
        for form in sorted(occ[(lemma, pos)]):
            by_syn = occ[(lemma, pos)][form]
            syns = sorted(by_syn)
            for s in syns:
                if len(by_syn[s]) >= 2:
                    pos_c.setdefault((s, s), []).append(tuple(rng.sample(by_syn[s], 2)))
            for s1, s2 in itertools.combinations(syns, 2):
                o1, o2 = rng.choice(by_syn[s1]), rng.choice(by_syn[s2])
                if o1[0] != o2[0]:  # the same example listed under two synsets is no pair
                    neg_c.setdefault((s1, s2), []).append((o1, o2))
        m = min(len(pos_c), len(neg_c), cap_per_lemma)
        if m == 0:
            continue
        split = wic_split(lemma, seed)
        for cands, label in ((pos_c, True), (neg_c, False)):
            for key in rng.sample(sorted(cands), m):
                o1, o2 = rng.choice(cands[key])
                records.append(_pair(lemma, pos, key[0], o1, key[1], o2, label, split, rng))
    order = {name: i for i, (name, _) in enumerate(WIC_SPLIT_FRACTIONS)}
    records.sort(key=lambda r: (order[r["split"]], r["word"], r["pos"], not r["label"],
                                r["synset1"], r["synset2"], r["sentence1"]))
    return records


# ----------------------------------------------------------------------------- 3. WordNet POS

POS_LABELS = ("noun", "verb", "adjective", "adverb")  # label int = index
_POS_NAME = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}
POS_PER_CLASS, POS_N_VALIDATION, POS_N_TEST = 1000, 100, 100


def build_wordnet_pos(
    synsets: Iterable[dict],
    seed: int = DEFAULT_SEED,
    per_class: int = POS_PER_CLASS,
    n_validation: int = POS_N_VALIDATION,
    n_test: int = POS_N_TEST,
) -> list[dict]:
    """Definitions labelled with the POS of their synset ("predict the part of speech of the
    defined word from its definition"), ``per_class`` per class; per class ``n_test`` go to test,
    ``n_validation`` to validation, the rest to train. Definitions that occur more than once in
    WordNet (any synset/POS) are dropped so no text is repeated across classes or splits.
    Satellite adjectives (``s``) count as adjectives."""
    synsets = list(synsets)
    counts = Counter(" ".join(s["definition"].split()) for s in synsets)
    by_class: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for syn in synsets:
        text = " ".join(syn["definition"].split())
        if text and counts[text] == 1:
            by_class[_POS_NAME[syn["pos"]]].append((syn["id"], text))
    records = []
    for label, name in enumerate(POS_LABELS):
        cands = sorted(by_class[name])
        if len(cands) < per_class:
            raise ValueError(f"only {len(cands)} unique {name} definitions, need per_class={per_class}")
        chosen = random.Random(f"{seed}:pos:{name}").sample(cands, per_class)
        for i, (sid, text) in enumerate(chosen):
            split = "test" if i < n_test else "validation" if i < n_test + n_validation else "train"
            records.append({"text": text, "label": label, "label_name": name, "split": split,
                            "synset": sid})
    rng = random.Random(f"{seed}:pos:order")
    out = []
    for split in ("train", "validation", "test"):  # classes interleaved within each split
        part = sorted((r for r in records if r["split"] == split), key=lambda r: r["synset"])
        rng.shuffle(part)
        out.extend(part)
    return out


# ----------------------------------------------------------------------------- NOTICE.md


def _read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _table(rows: list[list], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _sentence_coverage(source: Path) -> str:
    """How many sentences the rule finds before the length filter (empty if the source is absent)."""
    try:
        n = [count_words(s) for p in read_paragraphs(source) for s in split_sentences(p)]
    except FileNotFoundError:
        return " novel"
    short = sum(k < SENT_MIN_WORDS for k in n)
    long_ = sum(k > SENT_MAX_WORDS for k in n)
    return (f" novel: the rule finds {len(n)} sentences, {short} shorter than {SENT_MIN_WORDS} words and"
            f" {long_} longer than {SENT_MAX_WORDS}, before duplicates are removed")


def write_notice(out: Path, source: Path, seed: int) -> str:
    """(Re)write ``out/NOTICE.md`` describing the files present in ``out`` (counts read back)."""
    out = Path(out)
    parts = [
        "# Evaluation data shipped with outlierlab",
        "",
        "Generated by `python scripts/build_eval_data.py all` (this file is rewritten by every run; do not edit",
        f"by hand). Seed {seed}. Source: the shared data folder (PROVENANCE.md there), read offline from Debian",
        "packages. None of this text is in the pretraining corpus (Austen's other five novels, *Moby Dick*, KJV).",
        "All files are gzip-compressed UTF-8; JSONL files hold one JSON object per line. Loaders:",
        "`datamodules.eval_data.load_sentences / load_wic / load_wordnet_pos`.",
        "",
    ]
    f = out / SENTENCES_FILE
    if f.is_file():
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            sents = fh.read().splitlines()
        freq = word_sentence_freq(sents)
        nwords = [count_words(s) for s in sents]
        ge10 = sum(1 for c in freq.values() if c >= 10)
        parts += [
            f"## `{SENTENCES_FILE}` — held-out English sentences",
            "",
            "- **What**: sentences of Jane Austen's *Persuasion* (1817), one per line, in text order. For outlier",
            "  statistics, anisotropy and self-similarity (Ethayarajh 2019; Luo et al. 2021 §4.1: 2000 sentences,",
            "  words occurring in ≥ 10 sentences) and the position probe (Luo et al. §3).",
            f"- **Source**: `{PERSUASION}` (r-cran-janeaustenr 1.0.0; one paragraph per line).",
            "- **Sentence rule**: whitespace collapsed; a sentence ends at `.`/`!`/`?` (plus closing quotes or",
            "  brackets) followed by whitespace and an upper-case letter (optionally after an opening quote); a `.`",
            f"  after {', '.join(sorted(ABBREVIATIONS))} does not end a sentence. Quotations that continue in lower",
            "  case (`\"Indeed!\" was the reply`) stay one sentence; `;`, `:` and `--` never split.",
            f"- **Kept**: {SENT_MIN_WORDS} ≤ words ≤ {SENT_MAX_WORDS}, words = matches of `{WORD_RE.pattern}`",
            "  (punctuation and `--` are not words); exact duplicates removed (first kept).",
            f"- **Counts**: {len(sents)} sentences; words per sentence min {min(nwords)}, median"
            f" {sorted(nwords)[len(nwords) // 2]}, max {max(nwords)}; {sum(nwords)} words in all;"
            f" {len(freq)} word types (lower-cased), of which **{ge10} occur in ≥ 10 sentences**"
            f" ({sum(1 for c in freq.values() if c >= 5)} in ≥ 5).",
            "- **Coverage**: every sentence of the novel within the bounds is kept (Persuasion is Austen's shortest"
            + _sentence_coverage(source) + "); Luo et al. used 2000 sentences for anisotropy.",
            "- **Terms**: the novel is in the public domain; the janeaustenr package is MIT-licensed.",
            f"- sha256 `{_sha256(f)}`",
            "",
        ]
    f = out / WIC_FILE
    if f.is_file():
        recs = _read_jsonl_gz(f)
        splits = [name for name, _ in WIC_SPLIT_FRACTIONS]
        rows = []
        for sp in splits + ["all"]:
            rs = [r for r in recs if sp in ("all", r["split"])]
            npos = sum(r["label"] for r in rs)
            same = sum(r["sentence1"][r["start1"]:r["end1"]]
                       == r["sentence2"][r["start2"]:r["end2"]] for r in rs)
            pos_counts = Counter(r["pos"] for r in rs)
            rows.append([sp, len(rs), npos, len(rs) - npos, len({r["word"] for r in rs}),
                         " ".join(f"{p}:{pos_counts[p]}" for p in "NVAR"),
                         f"{100 * npos / max(len(rs), 1):.1f}%", f"{100 * same / max(len(rs), 1):.0f}%"])
        parts += [
            f"## `{WIC_FILE}` — Word-in-Context pairs from WordNet examples",
            "",
            "- **What**: WiC-style pairs (Pilehvar & Camacho-Collados 2019): does the target word have the same",
            "  sense in both sentences? Fields: `word` (lemma, lower case), `pos` (N/V/A/R; satellite adjectives",
            "  are A), `sentence1`, `sentence2`, `start1`, `end1`, `start2`, `end2` (character offsets, end",
            "  exclusive: `sentence1[start1:end1]` is the target token), `label` (true = same synset), `synset1`,",
            "  `synset2` (WordNet 3.0 ids `offset-pos`), `split`. Used for Luo et al. §4.2 (cosine of the two",
            "  target vectors, threshold sweep per layer).",
            f"- **Source**: `{SYNSETS}` (wordnet-base 1:3.0), the quoted example sentences of each synset.",
            "- **Target search**: single-word lemmas only; in each example of a synset, the lemma is searched",
            "  among tokens `[A-Za-z]+(-[A-Za-z]+)*`, case-insensitively, as the lemma or a regular inflection",
            "  (nouns -s/-es/-ies; verbs -s/-es/-ed/-d/-ing, e-drop, -ied, doubled consonant; adjectives",
            "  -er/-est). Examples where the form occurs 0 or ≥ 2 times are skipped (no guessing).",
            "- **Identical surface forms**: a pair is only formed between two examples whose target tokens are",
            "  exactly the same string, case included (`banks` ≠ `bank`, `Bank` ≠ `bank`), so form gives no clue.",
            "- **Pairs**: positive = two different examples of the SAME synset; negative = one example from each",
            "  of two DIFFERENT synsets of the same lemma and POS. At most one pair per (lemma, POS, synset pair);",
            f"  per (lemma, POS) m = min(#positive candidates, #negative candidates, {WIC_CAP_PER_LEMMA}) of each are",
            "  drawn (seeded), so the set is balanced overall, per split and per lemma, and no polysemous lemma",
            f"  contributes more than {2 * WIC_CAP_PER_LEMMA} pairs per POS. Sentence order within a pair is random.",
            "- **Splits by lemma**: sha256 of the lemma string → "
            + " / ".join(f"{n} {int(100 * p)}%" for n, p in WIC_SPLIT_FRACTIONS)
            + " of lemmas; a lemma (all its POS) lies in one split only.",
            "",
            _table(rows, ["split", "pairs", "positive", "negative", "lemmas", "by POS",
                          "all-true / surface-form baseline acc.", "identical forms"]),
            "",
            "- **Surface-form baseline**: predicting \"same sense\" iff the two target tokens are identical is, with",
            "  identical forms everywhere, the all-true baseline: accuracy = share of positives = 50.0%",
            "  (column above). Because each lemma has as many positives as negatives, a lemma-identity baseline",
            "  is also 50%.",
            "- **Caveats**: WordNet examples are short and some are phrases, not sentences; some synsets share",
            "  near-identical examples; a regular inflection may occasionally match another word's form.",
            "- **Terms**: derived from WordNet 3.0 — WordNet 3.0 Copyright 2006 by Princeton University. All rights",
            "  reserved. Used under the WordNet 3.0 licence, reproduced in `LICENSE.wordnet` (must accompany any copy).",
            f"- sha256 `{_sha256(f)}`",
            "",
        ]
    f = out / POS_FILE
    if f.is_file():
        recs = _read_jsonl_gz(f)
        rows = []
        for sp in ("train", "validation", "test", "all"):
            rs = [r for r in recs if sp in ("all", r["split"])]
            c = Counter(r["label_name"] for r in rs)
            rows.append([sp, len(rs)] + [c[n] for n in POS_LABELS])
        parts += [
            f"## `{POS_FILE}` — part of speech from the definition",
            "",
            "- **Task**: predict the part of speech of the defined word from its definition. A small real labelled",
            "  set for the linear-classifier probe (Luo et al. §4.4 used SST-2/SST-5/IMDB, which cannot ship offline).",
            "- **Fields**: `text` (the WordNet gloss), `label` (int: "
            + ", ".join(f"{i} {n}" for i, n in enumerate(POS_LABELS))
            + "), `label_name`, `split` (train/validation/test), `synset` (WordNet 3.0 id, for provenance).",
            f"- **Built**: from `{SYNSETS}`; satellite adjectives (`s`) merged into adjective; definitions that occur",
            "  more than once anywhere in WordNet dropped (no repeated text across classes or splits); per class a",
            f"  seeded sample of {POS_PER_CLASS}, of which {POS_N_TEST} test, {POS_N_VALIDATION} validation, the rest",
            "  train; classes interleaved (seeded shuffle) within each split. Majority baseline 25%.",
            "- **Caveat**: glosses carry strong lexical cues (adverb glosses often read \"in a … manner\", verb",
            "  glosses start with a verb), so the task is easy for good encoders; it measures whether a layer's",
            "  vectors keep that information linearly, before/after clip or whitening.",
            "",
            _table(rows, ["split", "rows"] + list(POS_LABELS)),
            "",
            "- **Terms**: derived from WordNet 3.0 — WordNet 3.0 Copyright 2006 by Princeton University. All rights",
            "  reserved. Used under the WordNet 3.0 licence, reproduced in `LICENSE.wordnet`.",
            f"- sha256 `{_sha256(f)}`",
            "",
        ]
    parts += [
        "## Licence files",
        "",
        "- `LICENSE.wordnet`: copied verbatim from the shared data folder (Debian wordnet-base copyright file).",
        "",
    ]
    text = "\n".join(parts)
    (out / "NOTICE.md").write_text(text, encoding="utf-8")
    return text


# ----------------------------------------------------------------------------- CLI


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
        shutil.copyfile(_open_source(source, LICENSE_WORDNET), out / LICENSE_WORDNET)
    write_notice(out, source, seed)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="?", default="all", choices=["sentences", "wic", "pos", "all"])
    p.add_argument("--source", type=Path, default=None,
                   help="shared data folder holding corpora/ (default ../shared/data or /work/shared/data)")
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
