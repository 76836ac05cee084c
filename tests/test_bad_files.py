"""Every user data file input x every fault -> one line naming the file and the fault, before any model loads
(outlierlab/datamodules/validation.py, called by train.py, probe.py and evaluate.py).

Each case writes a bad file into a temporary directory, composes the entry point's config exactly as the
command line would (``data.files=[...]``, ``task.files=[...]``, ``wic.files=[...]``, ``sts.files=[...]``,
``encoder.name_or_path=...``) and runs the entry point's load step, :func:`validate_inputs`.
"""

from __future__ import annotations

import gzip
import json
import warnings

import pytest

from outlierlab.datamodules.validation import DataFileError, validate_inputs

GOOD_SENTENCES = ["The captain walked along the shore.", "Anne saw the ship leave the harbour.",
                  "It rained all day in Bath.", "They spoke of the war.", "A letter came at noon."]
STS_HEAD = ["sentence1", "sentence2", "score"]
WIC_PAIR = {"sentence1": "the bank of the river", "sentence2": "the bank gave money", "start1": 4, "end1": 8,
            "start2": 4, "end2": 8, "label": False, "split": "test"}

# input -> (entry point, config key, file name, composed overrides)
INPUTS = {
    "corpus": ("train", "data.files", "corpus.txt", ["data=files"]),
    "sentences": ("evaluate", "data.files", "sentences.txt", []),
    "classifier": ("probe", "task.files", "train.csv", ["task=local"]),
    "wic": ("evaluate", "wic.files", "pairs.jsonl", []),
    "sts": ("evaluate", "sts.files", "pairs.csv", []),
    "model": ("evaluate", "encoder.name_or_path", "model_dir", []),
}
FAULTS = ["missing", "empty", "header_only", "bad_column", "bad_value", "non_utf8", "too_small", "truncated_gzip"]

# combinations that cannot occur, and why
IMPOSSIBLE = {
    **{(i, f): "a one-sentence-per-line text file has no header, columns or typed values"
       for i in ("corpus", "sentences") for f in ("header_only", "bad_column", "bad_value")},
    ("corpus", "too_small"): "the training corpus is split into blocks only after tokenization; outlierlab/datamodules/corpus.py "
                             "reports too few blocks (tests/test_data_errors.py::test_too_few_blocks_for_a_validation_split)",
    ("wic", "header_only"): "JSON lines have no header row (an empty JSON list is the 'empty' case)",
    **{("model", f): "a model directory is a directory of weights and configs, not a table or a gzip file"
       for f in ("header_only", "bad_column", "bad_value", "non_utf8", "too_small", "truncated_gzip")},
}


def _csv(rows: list[list]) -> str:
    return "\n".join(",".join(str(c) for c in r) for r in rows) + "\n"


def _good(inp: str) -> str:
    """The content of a valid file of this input."""
    if inp in ("corpus", "sentences"):
        return "\n".join(GOOD_SENTENCES) + "\n"
    if inp == "classifier":
        return _csv([["text", "label"], *[[s.replace(",", ""), i % 2] for i, s in enumerate(GOOD_SENTENCES * 4)]])
    if inp == "wic":
        # both splits of the default protocol: the sweep on `train`, the report on `test` (configs/wic/wordnet.yaml)
        return "\n".join(json.dumps({**WIC_PAIR, "split": sp}) for sp in ("train", "test") * 2) + "\n"
    if inp == "sts":
        return _csv([STS_HEAD, *[[a.replace(",", ""), b.replace(",", ""), float(i)] for i, (a, b) in
                                 enumerate(zip(GOOD_SENTENCES * 8, GOOD_SENTENCES[1:] * 8))]])
    raise AssertionError(inp)


def _bad(inp: str, fault: str, tmp_path):
    """Write the bad file; returns (path given on the command line, extra overrides, expected message parts)."""
    entry, key, name, _ = INPUTS[inp]
    path = tmp_path / name
    if inp == "model":
        if fault == "missing":
            return path, [], ["model_dir"]
        path.mkdir()
        return path, [], ["the directory is empty"]
    extra: list[str] = []
    if fault == "missing":
        return path, extra, ["file not found"]
    if fault == "empty":
        path.write_text("")
        return path, extra, ["the file is empty"]
    if fault == "truncated_gzip":
        path = tmp_path / (name + ".gz")
        path.write_bytes(gzip.compress(_good(inp).encode())[:-12])
        return path, extra, ["truncated"]
    if fault == "non_utf8":
        text = _good(inp).encode().split(b"\n")
        text[1] = text[1][:5] + b"\xe9t\xe9" + text[1][5:]  # latin-1 bytes on line 2
        path.write_bytes(b"\n".join(text))
        return path, extra, ["line 2 is not UTF-8"]
    if fault == "header_only":
        path.write_text(_good(inp).splitlines()[0] + "\n")
        return path, extra, ["but no rows"]
    if fault == "bad_column":
        if inp == "wic":
            path.write_text("\n".join(json.dumps({("lable" if k == "label" else k): v for k, v in WIC_PAIR.items()})
                                      for _ in range(3)) + "\n")
            return path, extra, ["no column 'label'", "did you mean 'lable'", "sentence1"]
        good = _good(inp).splitlines()
        header = {"classifier": "text,lable", "sts": "sentence1,sentence2,scroe"}[inp]
        path.write_text("\n".join([header, *good[1:]]) + "\n")
        col, typo = {"classifier": ("label", "lable"), "sts": ("score", "scroe")}[inp]
        return path, extra, [f"no column {col!r}", f"did you mean {typo!r}", "sentence1" if inp == "sts" else "text"]
    if fault == "bad_value":
        if inp == "wic":
            rows = [dict(WIC_PAIR) for _ in range(3)]
            rows[1]["label"] = "maybe"
            path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
            return path, extra, ["line 2, column 'label'", "'maybe'"]
        lines = _good(inp).splitlines()
        if inp == "sts":
            lines[2] = "a cat,a dog,very similar"
            path.write_text("\n".join(lines) + "\n")
            return path, extra, ["line 3, column 'score'", "'very similar'", "not a number"]
        lines[2] = "a text,"  # empty label
        path.write_text("\n".join(lines) + "\n")
        return path, extra, ["line 3, column 'label'", "integer or a class name"]
    if fault == "too_small":
        if inp == "sentences":
            path.write_text(GOOD_SENTENCES[0] + "\n")
            return path, extra, ["1 sentences are too few", "data.max_sentences"]
        if inp == "classifier":
            path.write_text(_csv([["text", "label"], ["only one row", 1]]))
            return path, extra, ["1 training rows leave -1", "task.val_fraction=0.1", "validation (1)"]
        if inp == "wic":
            path.write_text(json.dumps({**WIC_PAIR, "split": "train"}) + "\n")
            return path, ["wic.split=test"], ["no pair in split 'test'", "train"]
        if inp == "sts":
            path.write_text(_csv([STS_HEAD, ["a", "b", 1.0]]))
            return path, extra, ["1 pair", "at least 2"]
    raise AssertionError((inp, fault))


def _cfg(compose_cfg, inp: str, value, extra: list[str]):
    entry, key, _, overrides = INPUTS[inp]
    v = f"{key}={value}" if inp == "model" else f"{key}=[{value}]"
    return entry, compose_cfg(entry, [*overrides, v, *extra])


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("inp", list(INPUTS))
def test_each_bad_file_gives_one_line_naming_the_file_and_the_fault(inp, fault, tmp_path, compose_cfg):
    if (inp, fault) in IMPOSSIBLE:
        pytest.skip(IMPOSSIBLE[(inp, fault)])
    path, extra, parts = _bad(inp, fault, tmp_path)
    entry, cfg = _cfg(compose_cfg, inp, path, extra)
    with pytest.raises((DataFileError, FileNotFoundError)) as e:
        validate_inputs(cfg, entry)
    msg = str(e.value)
    assert "\n" not in msg.strip(), msg
    assert path.name in msg, msg
    for part in parts:
        assert part in msg, (part, msg)


@pytest.mark.parametrize("inp", [i for i in INPUTS if i != "model"])
def test_good_files_pass_and_still_load(inp, tmp_path, compose_cfg):
    _, _, name, _ = INPUTS[inp]
    for suffix in ("", ".gz"):
        path = tmp_path / (name + suffix)
        data = _good(inp).encode()
        path.write_bytes(gzip.compress(data) if suffix else data)
        entry, cfg = _cfg(compose_cfg, inp, path, [])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning for a good file
            assert validate_inputs(cfg, entry) == []
    if inp == "sts":  # the loader the analysis uses reads the same 32 pairs
        from outlierlab.datamodules.pair_sets import load_sts_pairs

        assert len(load_sts_pairs([str(tmp_path / name)], "test").s1) == 32


def test_few_sts_pairs_warn_with_the_count(tmp_path, compose_cfg):
    path = tmp_path / "small.csv"
    path.write_text(_csv([STS_HEAD, *[[f"a{i}", f"b{i}", i] for i in range(12)]]))
    cfg = compose_cfg("evaluate", [f"sts.files=[{path}]"])
    with pytest.warns(UserWarning, match=r"small\.csv: only 12 pairs .* valid but weak"):
        notes = validate_inputs(cfg, "evaluate")
    assert len(notes) == 1 and "12 pairs" in notes[0]
