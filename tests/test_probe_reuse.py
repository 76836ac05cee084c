"""A probe run in a directory that holds an earlier one leaves only its own outputs beside the files it does not own
(``ol.probe_positions(out_dir=X)`` twice, ``python probe.py hydra.run.dir=X`` twice): no order-use table, plot or
TensorBoard event of the earlier run next to a report and a probe_info.json that do not mention them; and two
processes probing into one directory are refused, as evaluate's are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lock_helpers import ENV, ROOT, held_run_lock

FEW = ["probe.epochs=1", "probe.max_positions=16"]


def _files(d: Path) -> set[str]:
    return {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}


def _events(d: Path) -> set[str]:
    return {p.name for p in (d / "tensorboard").glob("events.out.tfevents.*")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import outlierlab as ol
    from outlierlab.datamodules.eval_data import load_sentences
    from probe_fixtures import save_tiny_bert

    bert = save_tiny_bert(tmp_path_factory.mktemp("bert"), layers=1, hidden=16)
    return ol.load_encoder(str(bert), device="cpu"), list(load_sentences(None)[:40])


def test_a_reused_out_dir_holds_the_last_probe_and_the_callers_own_files(tmp_path, tiny):
    import outlierlab as ol
    from outlierlab.evaluation.analyses.order_use import TITLE

    enc, texts = tiny
    out = tmp_path / "notebook"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")  # the caller's own files in the folder given as out_dir
    (out / "mine.csv").write_text("a,b\n1,2\n")
    ol.probe_positions(enc, texts, seed=1, overrides=FEW, out_dir=out, progress=False)
    first = _files(out)
    assert TITLE in (out / "probe_report.md").read_text()
    assert {"order_use.csv", "order_use_layers.csv", "probe_info.json"} <= first
    events = _events(out)
    assert events
    assert set(json.loads((out / "probe_info.json").read_text())["files"]) | {"notes.txt", "mine.csv"} \
        == {f for f in first if not f.startswith("tensorboard/")} | {"tensorboard/"}

    ol.probe_positions(enc, texts, seed=1, overrides=[*FEW, "probe.order_use=false"], out_dir=out, progress=False)
    info = json.loads((out / "probe_info.json").read_text())
    assert "order_use" not in info and TITLE not in (out / "probe_report.md").read_text()
    assert not (out / "order_use.csv").exists() and not (out / "order_use_layers.csv").exists()
    # this run's events alone, not both runs' scalars mixed in one TensorBoard folder
    assert _events(out) and not _events(out) & events and len(_events(out)) == len(events)
    top = {f for f in _files(out) if not f.startswith("tensorboard/")}
    assert top == {f for f in info["files"] if f != "tensorboard/"} | {"notes.txt", "mine.csv"}
    assert "tensorboard/" in info["files"] and (out / "mine.csv").read_text() == "a,b\n1,2\n"


def test_a_probe_info_json_of_another_tool_removes_nothing(tmp_path):
    from outlierlab.evaluation.probing import PROBE_INFO, _listed_outputs
    from outlierlab.reports.run_outputs import remove_earlier_outputs

    (tmp_path / PROBE_INFO).write_text(json.dumps({"files": ["mine.csv"]}))  # no probe's facts: not the probe's
    (tmp_path / "mine.csv").write_text("x\n")
    assert remove_earlier_outputs(tmp_path, PROBE_INFO, _listed_outputs) == []
    assert (tmp_path / "mine.csv").exists()
    # a probe's, naming a path outside the directory's top level: skipped
    (tmp_path / PROBE_INFO).write_text(json.dumps({"task": "position", "transforms": ["none"],
                                                   "files": ["../mine.csv", "mine.csv", PROBE_INFO]}))
    assert remove_earlier_outputs(tmp_path, PROBE_INFO, _listed_outputs) == [PROBE_INFO, "mine.csv"]


def test_a_second_process_probing_into_the_same_out_dir_is_refused_before_it_touches_it(tmp_path, tiny):
    """ol.probe_positions(out_dir=X) took no lock (only probe.py did): a second process wrote X beside the first."""
    import outlierlab as ol
    from outlierlab.utils.dir_lock import RunDirBusy

    enc, texts = tiny
    out = tmp_path / "run"
    out.mkdir()
    (out / "probe_report.md").write_text("the first probe's report\n")
    with held_run_lock(out) as pid:
        with pytest.raises(RunDirBusy, match=rf"run directory .*run is in use by pid {pid} on ") as e:
            ol.probe_positions(enc, texts, seed=1, overrides=FEW, out_dir=out, progress=False)
        assert len(str(e.value).splitlines()) == 1
    assert _files(out) == {"probe_report.md", "run.lock"}
    assert (out / "probe_report.md").read_text() == "the first probe's report\n"


@pytest.mark.slow
def test_probe_py_twice_in_one_run_dir_keeps_only_the_second_runs_files(tmp_path, tiny):
    """The command line: the second run (order use off) leaves no order_use.csv of the first."""
    from probe_fixtures import save_tiny_bert

    bert = save_tiny_bert(tmp_path / "bert", layers=1, hidden=16)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(tiny[1]) + "\n")
    run = tmp_path / "run"
    base = [sys.executable, str(ROOT / "probe.py"), f"encoder.name_or_path={bert}", f"data.files=[{texts}]",
            "data.max_sentences=40", *FEW, "transform=[none]", "progress=false", "features.cache_dir=null",
            f"hydra.run.dir={run}"]
    events = set()
    for extra in ([], ["probe.order_use=false"]):
        events = _events(run)
        p = subprocess.run(base + extra, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
    assert "held an earlier probe" in p.stdout
    info = json.loads((run / "probe_info.json").read_text())
    assert not (run / "order_use.csv").exists() and "order_use.csv" not in info["files"]
    assert _events(run) and not _events(run) & events  # the first run's events are gone


def test_a_refused_probe_setting_leaves_the_earlier_probe_in_place(tmp_path, compose_cfg):
    """The settings are checked before the earlier outputs are removed: a typo'd second run does not empty the
    directory of the first."""
    from outlierlab.evaluation.probing import PROBE_INFO, run

    out = tmp_path / "run"
    out.mkdir()
    earlier = {"task": "position", "transforms": ["none"], "files": ["position_probe.csv", PROBE_INFO]}
    (out / PROBE_INFO).write_text(json.dumps(earlier))
    (out / "position_probe.csv").write_text("layer\n0\n")
    with pytest.raises(ValueError, match="probe.epochs"):
        run(compose_cfg("probe", ["probe.epochs=-1"]), out)
    assert _files(out) == {PROBE_INFO, "position_probe.csv"}  # and the lock is released
