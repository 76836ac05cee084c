"""Replicates across code versions: the same configuration and seed compared number by number, per path actually run."""

from __future__ import annotations

import json

import pytest

from outlierlab.jobs import run_state
from outlierlab.studies import aggregate as study
from outlierlab.studies.cells import find_cells
from outlierlab.studies.replicates import configuration, linked, mixed_code_coverage, replicate_rows
from tests.study_fixtures import plant_cell

V = {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 900.0}, 100: {"kurtosis": 2.0, "share": 0.2, "ppl": 300.0}}


def cell(root, pos: str, seed: int, code: str, loss: tuple[float, float], how: dict | None = None, **config):
    c = plant_cell(root, {"pos": pos, "seed": seed}, V, extra_config=config or None)
    (c / "csv" / "metrics.csv").write_text("epoch,step,val/loss,val/order_use\n"
                                           f"0,49,{loss[0]},0.5\n0,99,{loss[1]},1.0\n")
    (c / run_state.CODE_VERSIONS).write_text(json.dumps({"commit": code * 40, "dirty": False}) + "\n")
    run_state.write_manifest(c, {"seed": seed}, 100, 100)
    (c / "finished.json").write_text(json.dumps({"global_step": 100, "max_steps": 100, **(how or {})}))
    return c


def test_pairs_compare_every_shared_validation_and_ignore_paths(tmp_path):
    cell(tmp_path / "a", "learned", 1, "a", (5.0, 4.0), {"accelerator": "gpu", "deterministic": False})
    cell(tmp_path / "b", "learned", 1, "b", (5.0, 4.05), {"accelerator": "gpu", "deterministic": True})
    cell(tmp_path / "b", "learned", 2, "b", (5.0, 4.0))              # another seed: no pair
    rows = replicate_rows(find_cells([tmp_path / "a", tmp_path / "b"]))
    assert len(rows) == 1
    r = rows.iloc[0]
    assert r["seed"] == 1 and r["steps"] == 2 and {r["code_a"], r["code_b"]} == {"a" * 12, "b" * 12}
    assert r["max_abs_diff val/loss"] == pytest.approx(0.05) and r["max_abs_diff val/order_use"] == 0.0
    assert {r["how_a"], r["how_b"]} == {"gpu, not deterministic", "gpu, deterministic"}


def test_a_setting_that_changes_the_computation_is_no_replicate(tmp_path):
    a = cell(tmp_path / "a", "none", 1, "a", (5.0, 4.0), model={"hidden_size": 64})
    b = cell(tmp_path / "b", "none", 1, "b", (5.0, 4.0), model={"hidden_size": 128})
    cells = find_cells([a.parent, b.parent])
    assert configuration(cells[0]) != configuration(cells[1])
    assert replicate_rows(cells).empty


def test_how_often_checkpoints_are_kept_does_not_make_another_configuration(tmp_path):
    # saving a checkpoint draws no random number: a rerun keeping every 50-step checkpoint replicates one keeping two
    ckpt = lambda n, k: {"callbacks": {"model_checkpoint": {"every_n_train_steps": n, "save_top_k": k}}}
    a = cell(tmp_path / "a", "learned", 4, "a", (5.0, 4.0), **ckpt(100, 2))
    b = cell(tmp_path / "b", "learned", 4, "a", (5.0, 4.0), **ckpt(50, -1))
    monitor = {"callbacks": {**ckpt(50, -1)["callbacks"], "hidden_state_monitor": {"every_n_steps": 25}}}
    c = cell(tmp_path / "c", "learned", 4, "a", (5.0, 4.0), **monitor)
    cells = find_cells([a.parent, b.parent])
    assert configuration(cells[0]) == configuration(cells[1])
    rows = replicate_rows(cells)
    assert len(rows) == 1 and rows.iloc[0]["max_abs_diff val/loss"] == 0.0
    # only the checkpoints' settings are set aside: another callback's still counts
    assert configuration(find_cells([c.parent])[0]) != configuration(cells[0])


def test_a_run_stopped_before_its_end_is_compared_where_both_logged(tmp_path):
    # a CPU run stopped by a signal writes no finished.json; its rerun is still its replicate at every shared step
    a = cell(tmp_path / "a", "learned", 4, "a", (5.0, 4.0), {"accelerator": "cpu", "deterministic": False})
    b = cell(tmp_path / "b", "learned", 4, "a", (5.0, 4.25))
    (b / "finished.json").unlink()
    rows = replicate_rows(find_cells([a.parent, b.parent]))
    assert len(rows) == 1 and rows.iloc[0]["steps"] == 2
    assert rows.iloc[0]["max_abs_diff val/loss"] == pytest.approx(0.25)
    assert {rows.iloc[0]["how_a"], rows.iloc[0]["how_b"]} == {"cpu, not deterministic", "not recorded (not finished)"}


def test_linked_through_a_third_version():
    import pandas as pd

    rows = pd.DataFrame({"code_a": ["a", "b"], "code_b": ["c", "c"]})
    assert linked({"a", "b"}, rows)
    assert not linked({"a", "b"}, rows.iloc[:1])
    assert not linked({"a", "b"}, rows.iloc[:0])


def test_a_mixed_group_is_checked_against_its_own_configuration_only(tmp_path, capsys):
    """none: both batches reproduce an earlier run exactly (linked); learned: no replicate of its own path, however
    exact the other path's are -- study.md and the command line say so."""
    study_dir, earlier = tmp_path / "study", tmp_path / "earlier"
    for seed, code in ((1, "a"), (2, "b")):
        cell(study_dir, "none", seed, code, (6.0, 5.9))
        cell(study_dir, "learned", seed, code, (5.0, 4.0))
        cell(earlier, "none", seed, "c", (6.0, 5.9))                 # exact replicates of the none cells
    coverage = mixed_code_coverage(study.aggregate(find_cells([study_dir]), allow_mixed_code=True)[2],
                                   find_cells([earlier]))
    assert coverage["pos=none"].attrs["linked"] and len(coverage["pos=none"]) == 2
    assert (coverage["pos=none"]["max_abs_diff val/loss"] == 0).all()
    assert coverage["pos=learned"].empty and not coverage["pos=learned"].attrs["linked"]
    assert study.main([str(study_dir), "--allow-mixed-code", "--no-plots", "--out", str(tmp_path / "out"),
                       "--replicates", str(earlier)]) == 0
    printed = [l for l in capsys.readouterr().out.splitlines() if l.startswith("mixed code versions")]
    assert printed == ["mixed code versions not linked by a replicate of its own configuration: pos=learned"]
    md = (tmp_path / "out" / "study.md").read_text()
    assert "pos=learned: NOT linked" in md and "pos=none: linked" in md
    assert "| pos=learned | – | no replicate of this configuration on another code version |" in md


def test_one_code_version_needs_no_replicate(tmp_path):
    for seed in (1, 2):
        cell(tmp_path, "none", seed, "a", (6.0, 5.9))
    res = study.run([str(tmp_path)], plots=False, out=str(tmp_path / "out"))
    assert res["replicates"] == {} and "Replicates across" not in (tmp_path / "out" / "study.md").read_text()


def test_the_command_compares_the_replicates_it_is_given(tmp_path, capsys):
    """python -m outlierlab.studies.replicates A B: the pair's largest differences, printed and written; exit 1 with
    one line when nothing pairs (another seed)."""
    from outlierlab.studies.replicates import main

    a = cell(tmp_path / "a", "learned", 3, "a", (5.0, 4.0), {"accelerator": "gpu", "deterministic": True})
    b = cell(tmp_path / "b", "learned", 3, "a", (5.0, 4.0), {"accelerator": "gpu", "deterministic": True})
    assert main([str(a), str(b), "--out", str(tmp_path / "pairs.csv")]) == 0
    import pandas as pd

    rows = pd.read_csv(tmp_path / "pairs.csv")
    assert len(rows) == 1 and rows["max_abs_diff val/loss"].iloc[0] == 0.0 and rows["how_a"].iloc[0] == "gpu, deterministic"
    assert "gpu, deterministic" in capsys.readouterr().out
    other = cell(tmp_path / "c", "learned", 4, "a", (5.0, 4.0))
    assert main([str(a), str(other)]) == 1
    assert capsys.readouterr().err.strip() == "no two readable cells share a configuration and seed: nothing to compare"


def test_a_full_disk_leaves_no_table_cut_under_its_own_name(tmp_path, monkeypatch):
    from outlierlab.studies.replicates import main
    from tests.disk_helpers import fill_disk_for

    a = cell(tmp_path / "a", "learned", 3, "a", (5.0, 4.0))
    b = cell(tmp_path / "b", "learned", 3, "a", (5.0, 4.0))
    fill_disk_for(monkeypatch, "pairs.csv", left=60)
    with pytest.raises(OSError, match="No space left"):
        main([str(a), str(b), "--out", str(tmp_path / "pairs.csv")])
    monkeypatch.undo()
    assert not (tmp_path / "pairs.csv").exists() and not list(tmp_path.glob("*partial*"))
