"""run_state: code versions per start, the shared definition of finished/failed, and manifests that catch a torn cell."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from outlierlab.jobs import run_resume, run_state
from outlierlab.jobs.run_state import (code_version, failed_run, finished_run, mark_failed, mark_finished,
                                       record_start, result_files, verify_manifest)
from tests.conftest import ROOT
from tests.run_fixtures import METRICS_CSV, MONITOR_CSV, make_cell


@pytest.fixture
def cell(tmp_path):
    return make_cell(tmp_path / "seed=1")


def test_manifest_lists_result_files_with_sizes_hashes_and_rows(cell):
    manifest = json.loads((cell / "manifest.json").read_text())
    assert manifest["schema"] == 1 and manifest["global_step"] == 20 and manifest["max_steps"] == 20
    assert manifest["config"] == {"seed": 1}
    # checkpoints, event files, weights, the markers, the manifest itself and Hydra's .hydra/ (rewritten at every
    # launch) are not result files; the cell's overrides are kept in the manifest instead
    assert sorted(manifest["files"]) == ["config.yaml", "csv/metrics.csv", "hf/config.json",
                                         "monitor/hidden_states.csv"]
    assert manifest["overrides"] == ["seed=1"]
    m = manifest["files"]["csv/metrics.csv"]
    assert m == {"bytes": len(METRICS_CSV), "sha256": hashlib.sha256(METRICS_CSV.encode()).hexdigest(), "rows": 3}
    assert manifest["files"]["monitor/hidden_states.csv"]["rows"] == 2
    assert manifest["files"]["config.yaml"]["rows"] is None
    # the code version of the (first) start is the cell's code
    assert manifest["code"] == {k: manifest["code_versions"][0][k] for k in ("commit", "dirty", "describe")}
    assert json.loads((cell / "finished.json").read_text())["global_step"] == 20


def test_intact_cell_verifies_clean(cell):
    assert verify_manifest(cell) == []


def test_truncated_csv_is_one_named_problem(cell):
    path = cell / "csv" / "metrics.csv"
    path.write_text(METRICS_CSV[:-4])  # val ppl 329.7 cut to 32
    assert verify_manifest(cell) == [f"{cell}: csv/metrics.csv: truncated (last line has no newline: cut mid-row)"]


def test_csv_rows_removed_at_a_line_boundary(cell):
    path = cell / "monitor" / "hidden_states.csv"
    path.write_text("".join(MONITOR_CSV.splitlines(keepends=True)[:2]))
    assert verify_manifest(cell) == [f"{cell}: monitor/hidden_states.csv: 1 data rows, the manifest says 2"]


def test_header_only_and_ragged_csv(cell, tmp_path):
    (cell / "monitor" / "hidden_states.csv").write_text("step,name,statistic,dim,value\n")
    assert verify_manifest(cell) == [f"{cell}: monitor/hidden_states.csv: header only (no data rows)"]
    (cell / "monitor" / "hidden_states.csv").write_text(MONITOR_CSV.replace("0.5\n", "0.5,9\n"))
    assert verify_manifest(cell) == [f"{cell}: monitor/hidden_states.csv: line 3 has 6 fields, the header 5"]


def test_changed_and_missing_files(cell):
    (cell / "config.yaml").write_text("seed: 2\n")  # same size, other content
    assert verify_manifest(cell) == [f"{cell}: config.yaml: content changed (SHA-256 differs from the manifest)"]
    (cell / "config.yaml").unlink()
    assert verify_manifest(cell) == [f"{cell}: config.yaml: missing"]


def test_torn_finished_json_is_unfinished_and_one_problem(cell):
    text = (cell / "finished.json").read_text()
    (cell / "finished.json").write_text(text[: len(text) // 2])
    assert finished_run(cell) is None
    assert verify_manifest(cell) == [f"{cell}: finished.json: torn or short of max_steps"]


def test_finished_needs_integer_steps_at_the_budget(tmp_path):
    for body, ok in [({"global_step": 20, "max_steps": 20}, True), ({"global_step": 21, "max_steps": 20}, True),
                     ({"global_step": 19, "max_steps": 20}, False), ({"global_step": "20", "max_steps": 20}, False),
                     ({"global_step": True, "max_steps": 1}, False), ({"max_steps": 20}, False), ([20, 20], False)]:
        (tmp_path / "finished.json").write_text(json.dumps(body))
        assert (finished_run(tmp_path) is not None) is ok, body
    assert finished_run(tmp_path / "nowhere") is None


def test_missing_or_torn_manifest(tmp_path, cell):
    (cell / "manifest.json").write_text('{"schema": 1, "fil')
    assert verify_manifest(cell) == [f"{cell}: manifest.json: unreadable (torn?)"]
    (cell / "manifest.json").unlink()
    assert verify_manifest(cell) == [f"{cell}: manifest.json: missing"]


def test_code_versions_gain_a_line_per_start(tmp_path):
    record_start(tmp_path, 0)
    (tmp_path / ".hydra").mkdir()  # Hydra rewrites it at every start: each line keeps its own start's overrides
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- pos=none\n- trainer.max_steps=120\n")
    record_start(tmp_path, 60, config_changes={"trainer.max_steps": [60, 120]})
    lines = [json.loads(x) for x in (tmp_path / "code_versions.jsonl").read_text().splitlines()]
    assert [x["global_step_at_start"] for x in lines] == [0, 60]
    assert set(lines[0]) == {"started", "global_step_at_start", "commit", "dirty", "describe", "overrides"}
    assert lines[0]["overrides"] is None and lines[1]["overrides"] == ["pos=none", "trainer.max_steps=120"]
    assert lines[1]["config_changes"] == {"trainer.max_steps": [60, 120]}


def test_config_changes_pairs_every_differing_key_and_ignores_a_missing_file(tmp_path):
    (tmp_path / "config.yaml").write_text("seed: 1\ntrainer:\n  max_steps: 60\n  max_time: null\n"
                                          "module:\n  optimizer:\n    betas: [0.9, 0.98]\n")
    now = {"seed": 1, "trainer": {"max_steps": 120}, "module": {"optimizer": {"betas": (0.9, 0.98)}}, "pos": "none"}
    assert run_resume.config_changes(tmp_path / "config.yaml", now) == {
        "pos": [None, "none"], "trainer.max_steps": [60, 120]}  # max_time: None on both sides; a tuple is its list
    assert run_resume.config_changes(tmp_path / "absent.yaml", now) == {}
    # how a run is resumed or launched is not a change of the run: ckpt_path=last is the documented resume
    controls = {**now, "ckpt_path": "last", "threads": 2, "paths": {"cache_dir": "/elsewhere"}, "resume": True}
    assert run_resume.config_changes(tmp_path / "config.yaml", controls) == {
        "pos": [None, "none"], "trainer.max_steps": [60, 120]}


def test_run_controls_are_the_keys_a_cell_name_leaves_out():
    import yaml
    from tests.conftest import ROOT

    train = yaml.safe_load((ROOT / "configs" / "train.yaml").read_text())
    excluded = train["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"]
    assert set(run_resume.RUN_CONTROLS) == set(excluded) - {"experiment"}  # a config group, not a key


def test_code_version_is_head_of_this_checkout():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(run_state.__file__).parent,
                          capture_output=True, text=True).stdout.strip()
    version = code_version()
    assert version["commit"] == head and isinstance(version["dirty"], bool)


def test_code_version_outside_git_is_nulls(monkeypatch, tmp_path):
    monkeypatch.setattr(run_state, "_PACKAGE_DIR", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert code_version() == {"commit": None, "dirty": None, "describe": None}


def test_failed_then_finished(tmp_path):
    mark_failed(tmp_path, "hidden_size=130 is not divisible by num_heads=4", 0)
    assert failed_run(tmp_path)["error"].startswith("hidden_size=130") and finished_run(tmp_path) is None
    mark_finished(tmp_path, 5, 5, {}, None)
    assert failed_run(tmp_path) is None and not (tmp_path / "failed.json").exists()


def test_staging_files_are_not_results(tmp_path):
    (tmp_path / ".hf.partial-12").mkdir()
    (tmp_path / ".hf.partial-12" / "config.json").write_text("{}")
    (tmp_path / ".x.json.partial-3").write_text("{")
    (tmp_path / "report.md").write_text("# r\n")
    assert result_files(tmp_path) == ["report.md"]


def test_a_later_analysis_refreshes_the_manifest(cell, tmp_path):
    (cell / "monitor_posthoc").mkdir()
    (cell / "monitor_posthoc" / "metrics.csv").write_text("step,value\n0,1.5\n")
    (cell / "monitor" / "hidden_states.csv").write_text(MONITOR_CSV + "20,layer_0,mean,,0.25\n")
    assert verify_manifest(cell) == [f"{cell}: monitor/hidden_states.csv: 3 data rows, the manifest says 2"]
    manifest = run_state.refresh_manifest(cell, "posthoc")
    assert verify_manifest(cell) == []
    assert manifest["files"]["monitor_posthoc/metrics.csv"]["rows"] == 1 and manifest["refreshed"][0]["by"] == "posthoc"
    assert manifest["config"] == {"seed": 1} and manifest["global_step"] == 20  # the run's own facts are kept
    assert run_state.refresh_manifest(tmp_path, "posthoc") is None  # no manifest: left alone


def test_a_relaunch_rewriting_hydras_folder_is_not_tampering(cell):
    (cell / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    num: 5\n")  # the study grew: another job number
    (cell / ".hydra" / "overrides.yaml").write_text("- seed=1\n- threads=2\n")
    assert verify_manifest(cell) == []


def test_code_shipped_without_git_records_the_stated_commit(monkeypatch):
    """git archive to a machine without .git: the launcher's $OUTLIERLAB_CODE_VERSION is recorded, and said so."""
    from outlierlab.jobs import run_state

    monkeypatch.setattr(run_state, "_git", lambda *a: None)
    monkeypatch.delenv(run_state.CODE_VERSION_ENV, raising=False)
    assert run_state.code_version() == {"commit": None, "dirty": None, "describe": None}
    monkeypatch.setenv(run_state.CODE_VERSION_ENV, "70e824bfb7dd441d3df91731db6f436af9bea8f0")
    v = run_state.code_version()
    assert v["commit"].startswith("70e824b") and v["dirty"] is False and v["stated_by"] == "OUTLIERLAB_CODE_VERSION"


def test_set_aside_end_state_keeps_every_earlier_export_and_unmarks_the_run(cell):
    assert finished_run(cell) is not None and (cell / "hf" / "config.json").read_text() == "{}"
    lines = run_resume.set_aside_end_state(cell, 20)
    assert finished_run(cell) is None and not (cell / "finished.json").exists()
    assert not (cell / "hf").exists() and (cell / "hf.before-resume-at-step20" / "config.json").read_text() == "{}"
    assert len(lines) == 1 and "hf.before-resume-at-step20/" in lines[0]
    (cell / "hf").mkdir()  # a second end (max_time) and a second resume from the same checkpoint: both kept
    (cell / "hf" / "config.json").write_text('{"second": 1}')
    run_resume.set_aside_end_state(cell, 20)
    assert (cell / "hf.before-resume-at-step20-2" / "config.json").read_text() == '{"second": 1}'
    assert run_resume.set_aside_end_state(cell, 20) == []  # nothing left to set aside


def test_set_aside_end_state_removes_the_export_of_a_stop_at_the_step_it_resumes_from(cell):
    """A run trained in fixed-length calls (max_time) exports at each stop: that export is a copy of the checkpoint
    the next call resumes from, so it goes; one of another step (resumed from an older checkpoint) is kept."""
    from outlierlab.jobs.model_card import record_trained_steps

    (cell / "finished.json").unlink()  # stopped early
    record_trained_steps(cell / "hf", 20)
    assert run_resume.set_aside_end_state(cell, 20) == [
        "hf/ held step 20 of a run stopped early, the checkpoint this resume starts from: removed (the run's end "
        "exports anew)"]
    assert sorted(p.name for p in cell.iterdir() if p.name.startswith(("hf", ".hf"))) == []
    (cell / "hf").mkdir()
    record_trained_steps(cell / "hf", 30)  # a stop at 30, resumed from the step-20 checkpoint: the only step 30
    run_resume.set_aside_end_state(cell, 20)
    assert (cell / "hf.before-resume-at-step20" / "trained_steps.json").exists()


def test_a_finished_run_is_skipped_only_when_the_command_would_re_enter_it(cell):
    from omegaconf import OmegaConf

    def cfg(**extra):
        return OmegaConf.create({"run_dir": str(cell), "trainer": {"max_steps": 20}, **extra})

    assert run_state.skip_finished(cfg()) == {"val/ppl": 329.7}  # finished.json's metrics, as train() returns them
    assert run_state.skip_finished(cfg(trainer={"max_steps": 30})) is None  # more steps: resumed
    assert run_state.skip_finished(cfg(ckpt_path="last")) is None
    assert run_state.skip_finished(cfg(skip_finished=False)) is None
    assert run_state.skip_finished(cfg(run_dir=str(cell.parent / "elsewhere"))) is None


def test_train_py_passes_a_finished_run_before_torch_loads(cell):
    """A relaunched study skips each finished cell in about a second, not the 5-8 s of importing torch and Lightning."""
    script = (f"import runpy, sys\nsys.argv = ['train.py', 'hydra.run.dir=\\'{cell}\\'', 'trainer.max_steps=20']\n"
              "runpy.run_path('train.py', run_name='__main__')\n"
              "print('loaded:', [m for m in ('torch', 'lightning', 'transformers') if m in sys.modules])\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "finished earlier (step 20): skipped" in r.stdout + r.stderr
    assert "loaded: []" in r.stdout
    assert "warning:" not in r.stderr  # the settings' warnings are for a run that trains
