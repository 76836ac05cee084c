"""``wordnet_pos.jsonl.gz``: WordNet definitions labelled with the part of speech of the defined
synset, a small real 4-class set for the linear-classifier probe (stand-in for SST-2/IMDB,
Luo et al. 2021 §4.4)."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable

from .common import DEFAULT_SEED

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
