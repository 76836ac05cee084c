"""Tests for the shipped evaluation sets (outlierlab/datamodules/data/eval) and their builder script.

Checks that need the shared source data (../shared/data beside the repository) skip when it is absent.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from outlierlab.datamodules import eval_data

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "build_eval_data.py"
# The builder's parts (scripts/eval_sets/), imported the way the script imports them: scripts/ is not a package.
sys.path.insert(0, str(SCRIPT.parent))
from eval_sets import common  # noqa: E402
from eval_sets import sentences as sent_rules  # noqa: E402
from eval_sets import wic as wic_rules  # noqa: E402
from eval_sets import wordnet_pos as pos_rules  # noqa: E402

SOURCE = common.default_source()
HAVE_SOURCE = (SOURCE / common.SYNSETS).is_file() and (SOURCE / common.PERSUASION).is_file()
needs_source = pytest.mark.skipif(not HAVE_SOURCE, reason=f"shared source data not found at {SOURCE}")


@pytest.fixture(scope="module")
def wic():
    return eval_data.load_wic()


@pytest.fixture(scope="module")
def pos_rows():
    return eval_data.load_wordnet_pos()


@pytest.fixture(scope="module")
def source_synsets():
    if not HAVE_SOURCE:
        pytest.skip(f"shared source data not found at {SOURCE}")
    return {s["id"]: s for s in common.read_synsets(SOURCE)}


# ------------------------------------------------------------------ sentences


def test_count_words_and_split_rule_on_hand_cases():
    assert common.count_words("her word had no weight, her convenience was always to give way--she was only Anne.") == 16
    assert common.count_words("don't stop; well-known") == 3
    assert sent_rules.split_sentences('"Indeed!" was the reply. Charles Musgrove, Esq. of Uppercross came.  Not I. I would') == [
        '"Indeed!" was the reply.', "Charles Musgrove, Esq. of Uppercross came.", "Not I.", "I would",
    ]
    assert sent_rules.split_sentences('She laughed. "Oh! certainly," was his reply? Yes') == [
        "She laughed.", '"Oh! certainly," was his reply?', "Yes",
    ]


def test_shipped_sentences_respect_documented_bounds():
    sents = eval_data.load_sentences()
    assert len(sents) >= 2000  # Luo et al. §4.1 draw 2000 sentences for anisotropy
    counts = [common.count_words(s) for s in sents]
    assert min(counts) >= sent_rules.SENT_MIN_WORDS and max(counts) <= sent_rules.SENT_MAX_WORDS
    assert len(set(sents)) == len(sents)
    assert all(s == " ".join(s.split()) for s in sents)
    # enough repeated words for self-similarity (words in >= 10 sentences, Ethayarajh 2019)
    assert sum(c >= 10 for c in sent_rules.word_sentence_freq(sents).values()) >= 300


@needs_source
def test_sentences_come_from_persuasion_only():
    text = " ".join(" ".join(p.split()) for p in common.read_paragraphs(SOURCE))
    sents = eval_data.load_sentences()
    assert all(s in text for s in sents[::25])
    emma = gzip.open(SOURCE / "corpora/janeaustenr__emma.txt.gz", "rt", encoding="utf-8").read()
    emma = " ".join(emma.split())
    long_ones = [s for s in sents if common.count_words(s) >= 20][:200]
    assert not any(s in emma for s in long_ones)


# ------------------------------------------------------------------ WiC


def test_wic_balanced_overall_per_split_and_per_lemma(wic):
    assert len(wic) > 1000
    for split in eval_data.WIC_SPLITS:
        labels = Counter(r["label"] for r in wic if r["split"] == split)
        assert labels[True] == labels[False] > 0, split
    per_lemma = defaultdict(Counter)
    for r in wic:
        per_lemma[(r["word"], r["pos"])][r["label"]] += 1
    assert all(c[True] == c[False] <= wic_rules.WIC_CAP_PER_LEMMA for c in per_lemma.values())


def test_wic_offsets_point_at_identical_whole_target_tokens(wic):
    assert set(wic[0]) == {"word", "pos", "sentence1", "sentence2", "start1", "end1", "start2", "end2",
                           "label", "synset1", "synset2", "split"}

    def is_token(s, a, b):  # not inside a longer word or a hyphenated compound ("Look--a" is fine)
        before = s[max(a - 2, 0):a]
        after = s[b:b + 2]
        joined_before = before[-1:].isalnum() or (before[-1:] == "-" and before[:1].isalpha())
        joined_after = after[:1].isalnum() or (after[:1] == "-" and after[1:].isalpha())
        return not joined_before and not joined_after

    for r in wic:
        t1 = r["sentence1"][r["start1"]:r["end1"]]
        t2 = r["sentence2"][r["start2"]:r["end2"]]
        assert t1 == t2 and t1, r  # identical surface form: form alone cannot separate the labels
        assert is_token(r["sentence1"], r["start1"], r["end1"]) and is_token(r["sentence2"], r["start2"], r["end2"]), r
        assert t1.lower() in wic_rules.surface_forms(r["word"], r["pos"].lower()), r
        assert r["sentence1"] != r["sentence2"]


def test_wic_labels_agree_with_synsets_and_one_pair_per_synset_pair(wic):
    seen = set()
    for r in wic:
        assert r["label"] == (r["synset1"] == r["synset2"]), r
        key = (r["word"], r["pos"], *sorted((r["synset1"], r["synset2"])))
        assert key not in seen, key
        seen.add(key)


def test_wic_no_lemma_crosses_splits(wic):
    splits = defaultdict(set)
    for r in wic:
        splits[r["word"]].add(r["split"])
    assert all(len(s) == 1 for s in splits.values())
    assert {r["split"] for r in wic} == set(eval_data.WIC_SPLITS)


def test_wic_rows_rederive_from_wordnet(wic, source_synsets):
    for r in wic:
        for k in ("1", "2"):
            syn = source_synsets[r["synset" + k]]
            assert r["word"] in {lem.lower() for lem in syn["lemmas"]}, r
            assert r["sentence" + k] in {" ".join(e.split()) for e in syn["examples"]}, r
            assert wic_rules.WIC_POS[syn["pos"]] == r["pos"]


# ------------------------------------------------------------------ WordNet POS


def test_pos_set_balanced_and_label_ids_consistent(pos_rows):
    for split, n in (("train", 800), ("validation", 100), ("test", 100)):
        c = Counter(r["label_name"] for r in pos_rows if r["split"] == split)
        assert c == {name: n for name in eval_data.POS_LABELS}, split
    assert all(eval_data.POS_LABELS[r["label"]] == r["label_name"] for r in pos_rows)
    assert len({r["text"] for r in pos_rows}) == len(pos_rows)  # no text in two rows/splits


def test_pos_labels_match_synset_pos_in_source(pos_rows, source_synsets):
    letter = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}
    for r in random.Random(0).sample(pos_rows, 400):
        syn = source_synsets[r["synset"]]
        assert r["label_name"] == letter[syn["pos"]] == letter[syn["id"][-1]], r
        assert r["text"] == " ".join(syn["definition"].split())


# ------------------------------------------------------------------ builder: rules and determinism

TOY_SYNSETS = [
    {"id": "1-n", "pos": "n", "lemmas": ["bank"], "definition": "sloping land beside water",
     "examples": ["they sat on the bank of the river", "the bank was steep", "he walked along the river bank"]},
    {"id": "2-n", "pos": "n", "lemmas": ["bank", "depository_financial_institution"], "definition": "a money firm",
     "examples": ["he cashed a check at the bank", "the bank closed early", "banks lend money", "bank to bank"]},
    {"id": "3-n", "pos": "n", "lemmas": ["bank"], "definition": "a supply held in reserve",
     "examples": ["a blood bank", "a bank of knowledge"]},
    {"id": "4-v", "pos": "v", "lemmas": ["bank"], "definition": "do business with a bank",
     "examples": ["I bank with the local credit union", "we banked there"]},
    {"id": "5-v", "pos": "v", "lemmas": ["bank"], "definition": "tip laterally",
     "examples": ["the pilot banked the plane", "bank the aircraft"]},
    {"id": "6-r", "pos": "r", "lemmas": ["quickly"], "definition": "with speed", "examples": []},
    {"id": "7-r", "pos": "r", "lemmas": ["slowly"], "definition": "without speed", "examples": []},
    {"id": "8-a", "pos": "a", "lemmas": ["red"], "definition": "of the colour of blood", "examples": []},
    {"id": "9-s", "pos": "a", "lemmas": ["crimson"], "definition": "deep red", "examples": []},
    {"id": "10-n", "pos": "n", "lemmas": ["stone"], "definition": "a lump of rock", "examples": []},
    {"id": "11-v", "pos": "v", "lemmas": ["stone"], "definition": "kill with stones", "examples": []},
    {"id": "12-v", "pos": "v", "lemmas": ["run"], "definition": "move fast on foot", "examples": []},
    {"id": "13-n", "pos": "n", "lemmas": ["dup"], "definition": "a shared gloss", "examples": []},
    {"id": "14-v", "pos": "v", "lemmas": ["dup"], "definition": "a shared gloss", "examples": []},
]


def test_surface_forms_and_find_target():
    assert {"stopped", "stopping", "stops"} <= wic_rules.surface_forms("stop", "v")
    assert {"carried", "carries"} <= wic_rules.surface_forms("carry", "v")
    assert "happier" in wic_rules.surface_forms("happy", "a") and "boxes" in wic_rules.surface_forms("box", "n")
    assert wic_rules.find_target("the pilot banked the plane", wic_rules.surface_forms("bank", "v")) == (10, 16)
    assert wic_rules.find_target("bank to bank", wic_rules.surface_forms("bank", "n")) is None  # ambiguous -> skipped
    assert wic_rules.find_target("a well-banked road", wic_rules.surface_forms("bank", "v")) is None  # inside a compound


def test_build_wic_toy_counts_follow_the_rule():
    # noun "bank", form "bank": synsets 1 (3 examples), 2 (2; "banks ..." is another form, "bank to bank"
    # is ambiguous), 3 (2) -> 3 positive and 3 negative candidates; verb "bank": one example per
    # synset per form -> no positive, so the verb contributes nothing.
    rows = wic_rules.build_wic(TOY_SYNSETS, cap_per_lemma=3)
    assert Counter((r["word"], r["pos"], r["label"]) for r in rows) == {("bank", "N", True): 3, ("bank", "N", False): 3}
    assert {frozenset((r["synset1"], r["synset2"])) for r in rows if not r["label"]} == {
        frozenset(p) for p in (("1-n", "2-n"), ("1-n", "3-n"), ("2-n", "3-n"))}
    assert len(wic_rules.build_wic(TOY_SYNSETS, cap_per_lemma=1)) == 2


def test_build_wordnet_pos_toy_rule():
    rows = pos_rules.build_wordnet_pos(TOY_SYNSETS, per_class=2, n_validation=0, n_test=1)
    assert Counter((r["label_name"], r["split"]) for r in rows) == {
        (n, s): 1 for n in eval_data.POS_LABELS for s in ("train", "test")}
    assert "a shared gloss" not in {r["text"] for r in rows}  # repeated definitions dropped
    assert {r["synset"] for r in rows if r["label_name"] == "adjective"} == {"8-a", "9-s"}  # satellites merged
    with pytest.raises(ValueError, match="per_class"):
        pos_rules.build_wordnet_pos(TOY_SYNSETS, per_class=3)


def test_builders_are_deterministic_on_a_small_slice(tmp_path):
    paragraphs = ["Sir Walter Elliot, of Kellynch Hall, was a man who never took up any book but the Baronetage. "
                  "He read it often. Mr. Shepherd, a civil, cautious lawyer, said so to everyone he met that day."] * 3
    for builder, data, kw in ((wic_rules.build_wic, TOY_SYNSETS, {}),
                              (pos_rules.build_wordnet_pos, TOY_SYNSETS, {"per_class": 2, "n_test": 1, "n_validation": 0})):
        a, b = builder(data, **kw), builder(list(data), **kw)
        assert a == b and a
        common.write_jsonl_gz(a, tmp_path / "a.gz")
        common.write_jsonl_gz(b, tmp_path / "b.gz")
        assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()
    assert sent_rules.build_sentences(paragraphs) == sent_rules.build_sentences(paragraphs) == [
        "Sir Walter Elliot, of Kellynch Hall, was a man who never took up any book but the Baronetage.",
        "Mr. Shepherd, a civil, cautious lawyer, said so to everyone he met that day."]


def test_cli_output_identical_across_processes_on_a_toy_source(tmp_path):
    src = tmp_path / "src"
    (src / "corpora").mkdir(parents=True)
    (src / "LICENSE.wordnet").write_text("WordNet 3.0 Copyright 2006 by Princeton University.\n")
    with gzip.open(src / common.PERSUASION, "wt") as fh:
        fh.write("Anne walked alone to the end of the long gravel path. She was not sorry to be alone there.\n")
    with gzip.open(src / common.SYNSETS, "wt") as fh:
        fh.writelines(json.dumps(s) + "\n" for s in TOY_SYNSETS)
    outs = []
    for hashseed in ("1", "2"):
        out = tmp_path / f"out{hashseed}"
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        for what in ("sentences", "wic"):
            subprocess.run([sys.executable, str(SCRIPT), what, "--source", str(src), "--out", str(out)],
                           check=True, env=env, capture_output=True)
        outs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outs[0] == outs[1]
    assert set(outs[0]) == {"sentences.txt.gz", "wic_wordnet.jsonl.gz", "LICENSE.wordnet", "NOTICE.md"}


@needs_source
def test_shipped_files_equal_a_fresh_build(tmp_path):
    """The shipped files are what the script builds now (no stale data, no hidden hand edits)."""
    subprocess.run([sys.executable, str(SCRIPT), "all", "--source", str(SOURCE), "--out", str(tmp_path)],
                   check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "random"})
    for name in (common.SENTENCES_FILE, common.WIC_FILE, common.POS_FILE, "LICENSE.wordnet", "NOTICE.md"):
        assert (tmp_path / name).read_bytes() == (eval_data.EVAL_DATA_DIR / name).read_bytes(), name


# ------------------------------------------------------------------ loaders


def test_loaders_filter_splits_and_fail_clearly(tmp_path):
    dev = eval_data.load_wic(split="dev")
    assert dev and {r["split"] for r in dev} == {"dev"}
    assert len(dev) < len(eval_data.load_wic())
    assert {r["split"] for r in eval_data.load_wordnet_pos(split="validation")} == {"validation"}
    with pytest.raises(ValueError, match="unknown split"):
        eval_data.load_wic(split="validation")
    with pytest.raises(FileNotFoundError, match="build_eval_data.py"):
        eval_data.load_sentences(tmp_path / "missing.txt.gz")
    custom = tmp_path / "s.txt.gz"
    common.write_lines_gz(["one sentence here", "another one"], custom)
    assert eval_data.load_sentences(custom) == ["one sentence here", "another one"]
