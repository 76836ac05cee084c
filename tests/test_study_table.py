"""A study's run directories as one Parquet table (outlierlab.studies.table): the aggregator gives the same
numbers from the table as from the directories, a machine's paths are scrubbed while the manifest still checks every
byte, and no tracked text file names a machine's absolute path."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest

from outlierlab.studies import aggregate as study, table as study_table
from outlierlab.jobs.run_state import verify_manifest, write_manifest
from tests.conftest import ROOT
from tests.study_fixtures import plant_cell, plant_study


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OUTLIERLAB_CACHE", str(tmp_path / "cache"))


def test_cells_to_table_to_aggregator_equals_the_directories(tmp_path):
    sweep = plant_study(tmp_path / "sweep")
    plant_cell(sweep, {"pos": "none", "seed": 9}, {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}}, finished=False)
    table = study_table.pack(sweep, tmp_path / "sweep.parquet")
    assert set(table.columns) == {"cell", "file", "text"} and table["cell"].nunique() == 7
    assert not table["file"].str.contains("checkpoints").any()
    kw = dict(contrasts=["pos=learned,none"], plots=False)
    a = study.run([str(sweep)], out=str(tmp_path / "a"), **kw)["out"]
    b = study.run([str(tmp_path / "sweep.parquet")], out=str(tmp_path / "b"), **kw)["out"]
    for name in ("study.csv", "contrasts.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(a / name), pd.read_csv(b / name), check_exact=True)
    # the unfinished cell is refused from the table as from its folder
    assert "pos=none,seed=9" in (b / "study.md").read_text()


def test_paths_are_scrubbed_and_the_manifest_still_verifies(tmp_path):
    root = tmp_path / "work" / "runs"  # tmp_path itself lies under /tmp: a machine path
    cell = plant_cell(root, {"pos": "learned", "seed": 1}, {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}},
                      extra_config={"paths": {"cache_dir": "/scratch/lab/.gpu_cache"}})
    write_manifest(cell, {"seed": 1}, 100, 100)
    assert verify_manifest(cell) == []
    study_table.pack(root, tmp_path / "new" / "t.parquet")  # into a folder not made yet (a staging file failed there)
    table = pd.read_parquet(tmp_path / "new" / "t.parquet")
    assert not table["text"].str.contains("/scratch/|/tmp/", regex=True).any()
    config = table[table["file"] == "config.yaml"]["text"].iloc[0]
    assert "cache_dir: <local>/.gpu_cache" in config
    unpacked = study_table.resolve(tmp_path / "new" / "t.parquet") / cell.name
    assert verify_manifest(unpacked) == []  # every file checked, the scrubbed ones against their new bytes
    assert json.loads((unpacked / "manifest.json").read_text())["scrubbed"] == ["config.yaml"]
    (unpacked / "csv" / "metrics.csv").write_text("tampered\n")
    assert verify_manifest(unpacked)  # ... and a change is still caught


def test_one_line_for_a_folder_without_cells_and_a_file_that_is_not_a_table(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert study_table.main(["pack", str(tmp_path / "empty"), str(tmp_path / "x.parquet")]) == 1
    assert "no run directories" in capsys.readouterr().err
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="is not a study table"):
        study_table.cells_dir(tmp_path / "other.parquet")


def test_study_histories_is_one_tidy_frame(tmp_path):
    sweep = plant_study(tmp_path / "sweep")
    study_table.pack(sweep, tmp_path / "s.parquet")
    h = study_table.study_histories(tmp_path / "s.parquet")
    assert list(h.columns) == ["cell", "step", "name", "statistic", "dim", "value"]
    assert h["cell"].nunique() == 6 and set(h["statistic"]) == {"kurtosis", "argmax_share", "mean"}


def test_no_tracked_text_file_names_a_machine_path():
    """A machine's own folders: a user's home, /root, /work (this project's machines) -- not examples such as /tmp or
    /data, which name no machine."""
    import re

    # A component needs a letter or digit: an elided ``.../...`` is how docs shorten a path, not a path. The examples
    # are joined here so that this file names no machine path either.
    machine = re.compile(r"(?<![\w.<>/-])/(?:work|home|root|Users)/[\w.-]*\w[\w.-]*")
    work = "/" + "work"
    assert machine.search("at /" + "home/.cache/x") and machine.search(work + "/main") and not machine.search(work + "/...")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    exempt = {"tests/test_study_table.py"}  # names such paths on purpose
    hits = []
    for rel in files:
        path = ROOT / rel
        if rel in exempt or not path.is_file() or path.suffix in (".parquet", ".png", ".gz"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{rel}: {m.group(0)}" for m in machine.finditer(text)]
    assert not hits, "\n".join(hits[:20])


def _digest(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]  # the cache folder study_table.cells_dir unpacks to


def _repacked(frame: pd.DataFrame, out, other_than: str, before: bool) -> str:
    """``frame`` (the same cells and files) written to ``out`` in another row order, one whose cache folder sorts
    ``before`` (or after) the folder ``other_than``: the hash of a table's bytes is all that changes."""
    for k in range(200):  # each order's digest falls on either side with probability 1/2
        frame.sample(frac=1, random_state=k).to_parquet(out, compression="zstd", index=False)
        if (_digest(out) < other_than) == before:
            return _digest(out)
    raise AssertionError("no row order put the table's cache folder on the asked side")


def test_group_order_is_the_order_of_the_tables_given_not_of_their_cache_folders(tmp_path):
    """Two tables, one group each: the groups come in the order the tables are given, whichever of their cache
    folders (named by the hash of their bytes) sorts first, so re-packing a table changes nothing in the study."""
    none_root, learned_root = tmp_path / "none_cells", tmp_path / "learned_cells"
    for seed in (1, 2, 3):
        plant_cell(none_root, {"pos": "none", "seed": seed}, {0: {"kurtosis": 1.0 + seed, "share": 0.1, "ppl": 9.0}})
        plant_cell(learned_root, {"pos": "learned", "seed": seed},
                   {0: {"kurtosis": 2.0 * seed, "share": 0.2, "ppl": 8.0}})
    none_t, learned_t = tmp_path / "none.parquet", tmp_path / "learned.parquet"
    study_table.pack(none_root, none_t)
    learned = study_table.pack(learned_root, tmp_path / "packed.parquet")

    def run(*tables: str) -> tuple[list[str], str, str, pd.DataFrame]:
        out = tmp_path / "out"
        res = study.run([str(t) for t in tables], out=str(out), contrasts=["pos=learned,none"], plots=False)
        md = (out / "study.md").read_text()
        assert res["out"] == out
        return list(res["groups"]), md, (out / "contrasts.csv").read_text(), pd.read_csv(out / "study.csv")

    # the same cells packed twice, their cache folders on either side of none.parquet's
    first = _repacked(learned, learned_t, _digest(none_t), before=True)
    runs = [run(none_t, learned_t)]
    second = _repacked(learned, learned_t, _digest(none_t), before=False)
    runs.append(run(none_t, learned_t))
    assert first < _digest(none_t) < second
    (groups, md, contrasts, summary), again = runs
    assert groups == ["pos=none", "pos=learned"]  # the order of the arguments
    assert again[0] == groups and again[1] == md and again[2] == contrasts  # byte for byte
    pd.testing.assert_frame_equal(again[3], summary, check_exact=True)
    # study.md's columns and group rows in that order; within a table, its cells by their run directory's name
    assert "| metric | layer | step | pos=none | pos=learned |" in md
    assert md.index("| pos=none | 1, 2, 3 |") < md.index("| pos=learned | 1, 2, 3 |")
    assert "| pos=learned,seed=1, pos=learned,seed=2, pos=learned,seed=3 |" in md
    # the other order of the arguments is the other order of the groups (the numbers stay the same)
    swapped = run(learned_t, none_t)
    assert swapped[0] == ["pos=learned", "pos=none"]
    assert "| metric | layer | step | pos=learned | pos=none |" in swapped[1]
    pd.testing.assert_frame_equal(swapped[3], summary, check_exact=True)
