"""One process per run directory: the lock, its holder record, stale and requeued holders, and two
real train.py processes started on one directory."""

from __future__ import annotations

import csv
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from outlierlab.utils.dir_lock import RunDirBusy, lock_run_dir
from outlierlab.utils.dir_lock import is_primary_process, read_holder
from tests.conftest import ROOT
from tests.run_fixtures import SMALL

HOLD = """
import fcntl, json, os, sys, time
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(fd, 0)
os.write(fd, sys.argv[2].encode())
print("held", flush=True)
time.sleep(120)
"""


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def hold(path: Path, record: dict) -> subprocess.Popen:
    """Another process holding the flock on ``path`` with ``record`` written in it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), json.dumps(record)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_lock_is_refused_naming_the_holder(tmp_path):
    with lock_run_dir(tmp_path) as lock:
        assert read_holder(tmp_path / "run.lock") == lock.record
        assert lock.record["pid"] == os.getpid() and lock.record["host"] == socket.gethostname()
        with pytest.raises(RunDirBusy) as err:
            lock_run_dir(tmp_path)
        msg = str(err.value)
        assert "\n" not in msg and f"pid {os.getpid()} on {socket.gethostname()}" in msg and "hydra.run.dir=" in msg
    assert not (tmp_path / "run.lock").exists()  # released: the record goes with it
    with lock_run_dir(tmp_path):  # and the directory can be taken again
        pass


def test_a_live_holder_in_another_process_is_refused(tmp_path):
    proc = hold(tmp_path / "run.lock", {"host": socket.gethostname(), "pid": os.getppid(), "started": "t0",
                                        "slurm_job_id": None})
    try:
        with pytest.raises(RunDirBusy, match=f"pid {os.getppid()} on {socket.gethostname()} since t0"):
            lock_run_dir(tmp_path)
    finally:
        proc.kill()
        proc.wait()


LATE = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
time.sleep(float(sys.argv[3]))
os.write(fd, sys.argv[2].encode())
time.sleep(120)
"""


@pytest.mark.parametrize("delay,named", [(0.3, True), (5.0, False)])
def test_a_holder_that_has_not_written_its_record_yet_is_waited_for(tmp_path, delay, named):
    """The race CI hit: the winner holds the flock but writes its record a moment later. The loser waits
    briefly for the record and names the holder; a record that never comes is "no record yet"."""
    record = {"host": socket.gethostname(), "pid": os.getppid(), "started": "t0", "slurm_job_id": None}
    proc = subprocess.Popen([sys.executable, "-c", LATE, str(tmp_path / "run.lock"), json.dumps(record), str(delay)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirBusy) as err:
            lock_run_dir(tmp_path)
        assert (f"pid {os.getppid()} on {socket.gethostname()} since t0" in str(err.value)) is named
        assert ("no record yet" in str(err.value)) is not named
    finally:
        proc.kill()
        proc.wait()


def test_a_dead_holders_record_is_taken_over_with_a_warning(tmp_path, caplog):
    pid = dead_pid()
    (tmp_path / "run.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "started": "t0"}))
    with caplog.at_level(logging.WARNING), lock_run_dir(tmp_path) as lock:
        assert read_holder(tmp_path / "run.lock")["pid"] == os.getpid() == lock.record["pid"]
    assert f"pid {pid}" in caplog.text and "taking over" in caplog.text


def test_a_lock_held_in_the_name_of_a_dead_pid_is_broken(tmp_path, caplog):
    """A forked worker of a killed run may keep the flock; its record names the dead run's pid."""
    pid = dead_pid()
    proc = hold(tmp_path / "run.lock", {"host": socket.gethostname(), "pid": pid, "started": "t0"})
    try:
        with caplog.at_level(logging.WARNING), lock_run_dir(tmp_path):
            assert read_holder(tmp_path / "run.lock")["pid"] == os.getpid()
        assert f"its holder (pid {pid}) is dead" in caplog.text
    finally:
        proc.kill()
        proc.wait()


def test_a_requeued_slurm_job_reclaims_its_own_lock(tmp_path, monkeypatch):
    record = {"host": "node-7", "pid": 4242, "started": "t0", "slurm_job_id": "991"}
    proc = hold(tmp_path / "run.lock", record)
    try:
        monkeypatch.setenv("SLURM_JOB_ID", "990")  # another job: refused
        with pytest.raises(RunDirBusy, match="pid 4242 on node-7, SLURM job 991 since t0"):
            lock_run_dir(tmp_path)
        monkeypatch.setenv("SLURM_JOB_ID", "991")  # the same job, requeued: reclaimed
        with lock_run_dir(tmp_path) as lock:
            assert lock.record["slurm_job_id"] == "991" and read_holder(tmp_path / "run.lock")["pid"] == os.getpid()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("env,primary", [({}, True), ({"LOCAL_RANK": "0"}, True), ({"LOCAL_RANK": "1"}, False),
                                         ({"RANK": "3"}, False), ({"SLURM_PROCID": "0", "NODE_RANK": "1"}, False)])
def test_only_rank_zero_locks(monkeypatch, env, primary):
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert is_primary_process() is primary


def _keys(path: Path, cols: tuple[str, ...]) -> list[tuple]:
    with open(path, newline="") as fh:
        return [tuple(r[c] for c in cols) for r in csv.DictReader(fh)]


@pytest.mark.slow
def test_two_processes_on_one_run_directory_only_one_trains(tmp_path, shared_cache):
    run = tmp_path / "run"
    args = [sys.executable, "train.py", f"hydra.run.dir={run}", *SMALL, "trainer.max_steps=12",
            "trainer.val_check_interval=6", "callbacks.model_checkpoint.every_n_train_steps=6", "export=false",
            "callbacks.hidden_state_monitor.every_n_steps=3", "callbacks.layernorm_monitor.every_n_steps=3"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("OUTLIERLAB_DEBUG", None)
    procs = [subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], [o[1][-1500:] for o in outs]
    loser = outs[[p.returncode for p in procs].index(1)][1]
    errors = [line for line in loser.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is in use by pid" in errors[0] and socket.gethostname() in errors[0], loser[-1500:]
    assert json.loads((run / "finished.json").read_text())["global_step"] == 12
    assert sorted(p.name for p in (run / "checkpoints").glob("*.ckpt")) == ["last.ckpt", "step0000006.ckpt",
                                                                            "step0000012.ckpt"]
    for name, cols in (("hidden_states.csv", ("step", "name", "statistic", "dim")),
                       ("layernorm.csv", ("step", "name", "statistic", "dim"))):
        keys = _keys(run / "monitor" / name, cols)
        assert keys and not [k for k, n in Counter(keys).items() if n > 1], name
        assert {int(k[0]) for k in keys} >= {0, 12}
    steps = [k[0] for k in _keys(run / "csv" / "metrics.csv", ("step", "train/loss")) if k[1]]
    assert len(steps) == len(set(steps)) == 12
    assert not (run / "run.lock").exists()


def test_post_hoc_tools_leave_a_held_run_alone(tmp_path, capsys):
    from outlierlab.jobs import checkpoint_probes

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "finished.json").write_text(json.dumps({"global_step": 4, "max_steps": 4}))
    with lock_run_dir(tmp_path):
        assert checkpoint_probes.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"skipped: run directory {tmp_path} is in use by pid {os.getpid()}" in out


@pytest.mark.slow
def test_a_study_launched_twice_splits_its_cells(tmp_path, shared_cache):
    """Two launches of one 3-cell sweep at once: every cell is trained by exactly one of them (one start in its
    code_versions.jsonl), every cell finishes, and the skipped cells are listed."""
    sweep = tmp_path / "sweep"
    args = [sys.executable, "train.py", "-m", *SMALL, "seed=1,2,3", f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=s${seed}", "trainer.max_steps=8", "trainer.limit_val_batches=0", "export=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("OUTLIERLAB_DEBUG", None)
    procs = [subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1500:] for o in outs]
    for cell in ("s1", "s2", "s3"):
        assert json.loads((sweep / cell / "finished.json").read_text())["global_step"] == 8
        starts = (sweep / cell / "code_versions.jsonl").read_text().splitlines()
        assert len(starts) == 1, cell  # trained once, by one launch
        keys = _keys(sweep / cell / "monitor" / "hidden_states.csv", ("step", "name", "statistic", "dim"))
        assert not [k for k, n in Counter(keys).items() if n > 1], cell
    text = "".join(o[0] + o[1] for o in outs)
    skipped = text.count("skipped (held by another process)") + text.count("finished earlier (step 8)")
    assert skipped == 3, text[-3000:]  # each cell trained by one launch and skipped (held or done) by the other
