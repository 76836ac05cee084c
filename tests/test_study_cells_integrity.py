"""Cells that cannot be read wrong. Each planted fault is one line naming the cell and the file, the cell
is left out, and what remains equals the study of the clean cells alone."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from outlierlab.jobs import run_state
from outlierlab.studies import aggregate as study
from tests.study_fixtures import plant_cell, plant_study

V = {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 900.0}, 100: {"kurtosis": 50.0, "share": 0.9, "ppl": 100.0}}
EXP = {"experiment": "emergence_seeds"}


def _cut(path, keep_from_end: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-keep_from_end])


def plant_faults(root) -> dict[str, str]:
    """Six faulty cells beside the clean study; returns {cell name: the file its problem line must name}."""
    faults = {}
    c = plant_cell(root, {"pos": "learned", "seed": 4, **EXP}, V)  # a monitor CSV cut mid-number
    _cut(c / "monitor" / "hidden_states.csv", 4)
    faults[c.name] = "monitor/hidden_states.csv: truncated"
    c = plant_cell(root, {"pos": "none", "seed": 4, **EXP}, V)  # metrics.csv holds its header only
    (c / "csv" / "metrics.csv").write_text("epoch,step,val/ppl,train/loss,lr-AdamW\n")
    faults[c.name] = "csv/metrics.csv: header only"
    c = plant_cell(root, {"pos": "learned", "seed": 5, **EXP}, V)  # finished.json torn by a crash
    (c / "finished.json").write_text('{"global_step": 10')
    faults[c.name] = "finished.json: torn"
    c = plant_cell(root, {"pos": "none", "seed": 5, **EXP}, V)  # .hydra/overrides.yaml torn
    (c / ".hydra" / "overrides.yaml").write_text("- seed=5\n- pos: [none\n")
    faults[c.name] = ".hydra/overrides.yaml: unreadable"
    c = plant_cell(root, {"pos": "learned", "seed": 6, **EXP}, V, max_steps=100)  # finished at 100, extended to 200
    cfg = (c / "config.yaml").read_text().replace("max_steps: 100", "max_steps: 200")
    (c / "config.yaml").write_text(cfg)
    with (c / "monitor" / "hidden_states.csv").open("a") as fh:
        fh.write("150,layer_2,kurtosis,,99.0\n")
    faults[c.name] = "finished.json: records 100 of 100 steps but the config asks for 200"
    c = plant_cell(root, {"pos": "none", "seed": 6, **EXP}, V)  # a zero-byte CSV
    (c / "monitor" / "layernorm.csv").write_bytes(b"")
    faults[c.name] = "monitor/layernorm.csv: empty file (zero bytes)"
    return faults


def test_each_fault_is_one_line_and_the_rest_equals_the_clean_study(tmp_path, capsys):
    clean = plant_study(tmp_path / "clean")
    faulty = tmp_path / "faulty"
    shutil.copytree(clean, faulty)
    faults = plant_faults(faulty)
    ref = study.run([str(clean)], contrasts=["pos=learned,none"], plots=False, out=str(tmp_path / "a"))
    got = study.run([str(faulty)], contrasts=["pos=learned,none"], plots=False, out=str(tmp_path / "b"))
    assert len(got["unusable"]) == len(faults)
    for name, what in faults.items():
        lines = [p for p in got["unusable"] if f"/{name}: " in p]
        assert len(lines) == 1 and what in lines[0], (name, got["unusable"])
    assert got["groups"] == {"pos=learned": 3, "pos=none": 3}
    for f in ("study.csv", "contrasts.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(ref["out"] / f), pd.read_csv(got["out"] / f))
    md = (got["out"] / "study.md").read_text()
    assert "**Unusable, left out (6):**" in md and all(name in md for name in faults)
    assert study.main([str(faulty), "--no-plots", "--out", str(tmp_path / "c")]) == 0
    printed = [l for l in capsys.readouterr().out.splitlines() if l.startswith("unusable (left out): ")]
    assert len(printed) == 6


def _with_manifest(cell, commit: str) -> None:
    (cell / run_state.CODE_VERSIONS).write_text(json.dumps({"commit": commit, "dirty": False}) + "\n")
    run_state.write_manifest(cell, {"seed": 0}, 100, 100)


def test_a_cell_from_another_code_version_is_refused_unless_allowed(tmp_path):
    plant_study(tmp_path)
    for cell in tmp_path.iterdir():
        _with_manifest(cell, "a" * 40)
    other = plant_cell(tmp_path, {"pos": "learned", "seed": 4, **EXP}, V)
    _with_manifest(other, "b" * 40)
    with pytest.raises(ValueError, match=r"group pos=learned mixes code versions: aaaaaaaaaaaa \(seeds 1, 2, 3\); "
                                         r"bbbbbbbbbbbb \(seeds 4\).*--allow-mixed-code"):
        study.run([str(tmp_path)], plots=False)
    res = study.run([str(tmp_path)], plots=False, allow_mixed_code=True)
    assert res["groups"]["pos=learned"] == 4


def test_cells_without_manifest_are_one_unknown_version_but_not_with_known_ones(tmp_path):
    plant_study(tmp_path)
    res = study.run([str(tmp_path)], plots=False)
    assert len(res["notes"]) == 6 and all("no manifest: code version unknown" in n for n in res["notes"])
    _with_manifest(plant_cell(tmp_path, {"pos": "none", "seed": 4, **EXP}, V), "c" * 40)
    with pytest.raises(ValueError, match=r"group pos=none mixes code versions: cccccccccccc \(seeds 4\); unknown"):
        study.run([str(tmp_path)], plots=False)


def test_a_cell_resumed_with_other_settings_is_named_in_the_study(tmp_path):
    plant_study(tmp_path)
    for cell in tmp_path.iterdir():
        _with_manifest(cell, "a" * 40)
    resumed = sorted(tmp_path.iterdir())[0]
    with open(resumed / run_state.CODE_VERSIONS, "a") as fh:  # a second start that changed the masking rate
        fh.write(json.dumps({"commit": "a" * 40, "dirty": False, "global_step_at_start": 60,
                             "config_changes": {"module.mlm_probability": [0.15, 0.4]}}) + "\n")
    run_state.write_manifest(resumed, {"seed": 0}, 100, 100)
    res = study.run([str(tmp_path)], plots=False)
    assert res["notes"] == [f"{resumed.name}: resumed at step 60 with other settings: "
                            "module.mlm_probability 0.15 -> 0.4"]
    md = (res["out"] / "study.md").read_text()
    assert "**Resumed with other settings (1):**" in md and "Stopped before their budget" not in md


def test_a_file_changed_after_its_manifest_is_named_by_verify_manifest(tmp_path):
    plant_study(tmp_path)
    for cell in tmp_path.iterdir():
        _with_manifest(cell, "a" * 40)
    bad = tmp_path / "experiment=emergence_seeds,pos=none,seed=2"
    hist = bad / "monitor" / "hidden_states.csv"
    hist.write_text(hist.read_text().replace("100,layer_2,kurtosis,,1.5", "100,layer_2,kurtosis,,7.5"))
    res = study.run([str(tmp_path)], plots=False)
    assert res["unusable"] == [f"{bad}: monitor/hidden_states.csv: content changed (SHA-256 differs from the manifest)"]
    assert res["groups"] == {"pos=learned": 3, "pos=none": 2}


def test_a_statistic_with_two_rows_per_step_is_an_error_naming_it(tmp_path):
    plant_study(tmp_path)
    hist = tmp_path / "experiment=emergence_seeds,pos=none,seed=2" / "monitor" / "hidden_states.csv"
    with hist.open("a") as fh:
        fh.write("100,layer_2,kurtosis,,3.0\n")
    with pytest.raises(ValueError, match=r"hidden_states.csv: statistic 'kurtosis' has 2 rows at step 100, layer_2"):
        study.run([str(tmp_path)], plots=False)
