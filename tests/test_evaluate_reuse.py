"""An evaluation run in a directory that holds an earlier one leaves only its own outputs beside the files it does
not own: no CSV, figure or TensorBoard event of the earlier run next to a report and a results.json that do not
mention them (``python evaluate.py hydra.run.dir=X`` twice, ``ol.evaluate(..., out_dir=X)`` twice)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lock_helpers import ENV, ROOT, held_run_lock



def _texts() -> list[str]:
    from outlierlab.datamodules.eval_data import load_sentences

    return list(load_sentences(None)[:60])


def _files(d: Path) -> set[str]:
    return {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def minilm():
    import outlierlab as ol

    return ol.load_encoder("all-minilm-l6-v2", device="cpu")


def test_a_reused_out_dir_holds_the_last_evaluation_and_the_callers_own_files(tmp_path, minilm):
    import outlierlab as ol

    out = tmp_path / "notebook"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")  # the caller's files in the folder given as out_dir
    (out / "mine.csv").write_text("a,b\n1,2\n")
    ol.evaluate(minilm, _texts(), analyses=["outliers", "anisotropy"], transforms=["none"], out_dir=out, plots=True,
                progress=False)
    first = _files(out)
    assert {"anisotropy.csv", "anisotropy_contributions.csv", "anisotropy.png"} <= first

    ol.evaluate(minilm, _texts(), analyses=["outliers"], transforms=["none"], out_dir=out, progress=False)
    assert not (out / "anisotropy.csv").exists() and not (out / "anisotropy_contributions.csv").exists()
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["analyses"] == ["outliers"]
    # every file is this run's (named in its results.json) or the caller's: nothing of the first run is left
    assert _files(out) == set(meta["files"]) | {"notes.txt", "mine.csv"}
    assert set(meta["files"]) == {"outliers.csv", "layernorm.csv", "outliers_by_position.csv", "position_rows.csv",
                                 "results.json", "report.md"}
    assert not list(out.glob("*.png")) and "anisotropy" not in (out / "report.md").read_text()
    assert (out / "mine.csv").read_text() == "a,b\n1,2\n"


def test_a_run_stopped_half_way_in_a_reused_dir_does_not_read_as_the_earlier_evaluation(tmp_path, minilm,
                                                                                       monkeypatch):
    import outlierlab as ol
    from outlierlab.reports import evaluation_report

    out = tmp_path / "run"
    ol.evaluate(minilm, _texts(), analyses=["outliers"], transforms=["none"], out_dir=out, progress=False)
    assert (out / "results.json").is_file()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(evaluation_report, "write_outputs", full)
    with pytest.raises(OSError, match="No space left"):
        ol.evaluate(minilm, _texts(), analyses=["outliers"], transforms=["none"], seed=1, out_dir=out,
                    progress=False)
    # the earlier results.json and report.md would describe CSVs this run had begun to replace
    assert not (out / "results.json").exists() and not (out / "report.md").exists()


@pytest.mark.slow
def test_the_command_line_in_a_reused_run_dir_keeps_one_runs_tensorboard_events(tmp_path):
    out = tmp_path / "run"
    common = [f"hydra.run.dir={out}", "transform=[none]", "data.max_sentences=40", "plots=false", "progress=false"]
    for analyses in ("[outliers,anisotropy]", "[outliers]"):
        p = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), f"analyses={analyses}", *common], cwd=ROOT,
                           env=ENV, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
    assert "held an earlier evaluation" in p.stdout and "anisotropy.csv" in p.stdout
    assert not (out / "anisotropy.csv").exists() and not (out / "anisotropy_contributions.csv").exists()
    events = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1  # two event files would show both runs' scalars as one in TensorBoard
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(str(events[0])).Reload().Tags()["tensors"]
    assert tags and all(t.startswith("eval/outliers/") for t in tags)


def test_a_second_process_evaluating_into_the_same_out_dir_is_refused_before_it_touches_it(tmp_path, minilm):
    """ol.evaluate(out_dir=X) took no lock (only evaluate.py did): a second process wrote X beside the first."""
    import outlierlab as ol
    from outlierlab.utils.dir_lock import RunDirBusy

    out = tmp_path / "run"
    ol.evaluate(minilm, _texts(), analyses=["outliers"], transforms=["none"], out_dir=out, progress=False)
    before = {name: (out / name).read_bytes() for name in _files(out)}
    with held_run_lock(out) as pid:
        with pytest.raises(RunDirBusy, match=rf"run directory .*run is in use by pid {pid} on ") as e:
            ol.evaluate(minilm, _texts(), analyses=["anisotropy"], transforms=["none"], out_dir=out, progress=False)
        assert len(str(e.value).splitlines()) == 1
    assert {name: (out / name).read_bytes() for name in before} == before  # the first evaluation is untouched
