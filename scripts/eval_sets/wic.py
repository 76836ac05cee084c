"""``wic_wordnet.jsonl.gz``: a Word-in-Context-style set (Pilehvar & Camacho-Collados 2019 format)
built from WordNet 3.0 example sentences, with identical target surface forms in both sentences
(Luo et al. 2021 §4.2).

The inflection rule and pair sampler are hand-written: no library ships a WordNet-examples WiC builder.
Every draw is from an RNG seeded with a string, so the set does not depend on PYTHONHASHSEED.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections import defaultdict
from collections.abc import Iterable

from .common import DEFAULT_SEED

WIC_CAP_PER_LEMMA = 3  # at most this many positives AND this many negatives per (lemma, pos)
WIC_SPLIT_FRACTIONS = (("train", 0.7), ("dev", 0.1), ("test", 0.2))  # by lemma (hash of lemma)
WIC_POS = {"n": "N", "v": "V", "a": "A", "s": "A", "r": "R"}
_LEMMA_RE = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")  # single-word lemmas only (no '_' phrases)
_TARGET_RE = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")  # candidate target tokens in an example
_VOWELS = "aeiou"


def _unit_hash(key: str) -> float:
    """Deterministic number in [0, 1) from a string (stable across processes and slices)."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:15], 16) / 16**15


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
