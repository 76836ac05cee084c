"""Seeds as the normal way to run: Hydra's launchers run the cells, a re-run skips finished cells
and resumes interrupted ones, a stopped run saves last.ckpt, and the experiment trackers get the scalars."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.conftest import ROOT
from tests.run_fixtures import SMALL, final_weights, small_cfg
from tests.run_fixtures import CELL


class SignalAtStep(L.Callback):
    """Sends ``signum`` to this process once ``global_step`` reaches ``step`` (a scheduler stopping the job)."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum, self.sent = step, signum, False

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


def killer(step: int, signum: int) -> list[str]:
    return [f"+callbacks.killer._target_={__name__}.SignalAtStep", f"+callbacks.killer.step={step}",
            f"+callbacks.killer.signum={int(signum)}"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, shared_cache) -> Path:
    """A :data:`CELL` run trained straight through, the reference both stop-and-resume tests compare their resumed
    run with (trained once per module; only read)."""
    from outlierlab.jobs.training import train

    run = tmp_path_factory.mktemp("straight_cell") / "straight"
    train(small_cfg(run, *CELL))
    return run


@pytest.mark.slow
def test_sigterm_saves_last_ckpt_and_resume_equals_a_straight_run(tmp_path, straight):
    from outlierlab.jobs.training import train

    stopped = tmp_path / "stopped"
    with pytest.raises(SystemExit) as stop:  # Lightning's SIGTERMException, raised at the end of the step
        train(small_cfg(stopped, *CELL, *killer(4, signal.SIGTERM)))
    assert stop.value.code == 143  # not 0: `train.py && evaluate.py` must not go on with an unfinished run
    ckpt = torch.load(stopped / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 4  # not the periodic checkpoint of step 3: the step in flight was kept
    assert not (stopped / "finished.json").exists()
    train(small_cfg(stopped, *CELL))  # same command again: resumes (resume=true) from last.ckpt
    assert json.loads((stopped / "finished.json").read_text())["global_step"] == 6
    wa, wb = final_weights(straight), final_weights(stopped)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)
    # and a third time: finished, so skipped (nothing is trained, the metrics come from finished.json)
    mtime = (stopped / "checkpoints" / "last.ckpt").stat().st_mtime
    train(small_cfg(stopped, *CELL))
    assert (stopped / "checkpoints" / "last.ckpt").stat().st_mtime == mtime


class StopAtStep(L.Callback):
    """Stops training once ``global_step`` reaches ``step``, as Lightning's Timer does at ``trainer.max_time``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


@pytest.mark.slow
def test_a_time_limited_stop_saves_last_ckpt_and_resume_equals_a_straight_run(tmp_path, straight):
    # the scale ladder's cells stop at trainer.max_time and are resumed by the next call: the periodic checkpoint
    # (every 3 steps here; 1,000 in the ladder) was all they left, so the steps since were trained again
    from outlierlab.jobs.training import train

    stopped = tmp_path / "stopped"
    train(small_cfg(stopped, *CELL, f"+callbacks.stopper._target_={__name__}.StopAtStep", "+callbacks.stopper.step=5"))
    ckpt = torch.load(stopped / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 5  # not the periodic checkpoint of step 3
    assert not (stopped / "finished.json").exists()
    train(small_cfg(stopped, *CELL))  # the same command again: resumes from step 5
    assert json.loads((stopped / "finished.json").read_text())["global_step"] == 6
    wa, wb = final_weights(straight), final_weights(stopped)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)


def test_scheduler_requeue_signal_runs_after_the_checkpoint(tmp_path, shared_cache):
    """submitit requeues on SIGUSR2 and exits at once; while training, its handler waits for last.ckpt."""
    from outlierlab.jobs.training import train

    seen = []

    def requeue(signum, frame):  # stands in for submitit's checkpoint_and_try_requeue
        ckpt = tmp_path / "checkpoints" / "last.ckpt"
        seen.append(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] if ckpt.exists() else None)

    previous = signal.signal(signal.SIGUSR2, requeue)
    try:
        with pytest.raises(SystemExit):
            train(small_cfg(tmp_path, *CELL, *killer(2, signal.SIGUSR2)))
        assert seen == [2]  # called once, after last.ckpt of step 2 was written
        os.kill(os.getpid(), signal.SIGUSR2)  # after training the signal reaches the original handler at once
        assert seen == [2, 2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


@pytest.mark.slow
def test_mlflow_logger_receives_the_training_scalars(tmp_path, shared_cache):
    from mlflow.tracking import MlflowClient

    from outlierlab.jobs.training import train

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    train(small_cfg(tmp_path / "run", *CELL, "logger=mlflow", f"logger.mlflow.tracking_uri={uri}",
                    "logger.mlflow.run_name=cell", "study=mlflow_test"))
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("mlflow_test")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "cell"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    logged = {int(r["step"]): float(r["train/loss"]) for r in _csv_rows(tmp_path / "run") if r.get("train/loss")}
    assert {m.step: m.value for m in history} == pytest.approx(logged)  # the same numbers as metrics.csv
    assert len(history) == 6


def _csv_rows(run: Path) -> list[dict]:
    import csv

    with open(run / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _wandb_history(run_file: Path) -> list[dict]:
    """History records of an offline ``.wandb`` file (a LevelDB-style log of protobuf ``Record``s: 7-byte file
    header, 32 KiB blocks, 7-byte record headers crc32/length/type). wandb >= 0.20 reads it only in its Go
    core, so the test parses the framing itself."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, out, chunk = run_file.read_bytes(), 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a complete record
            rec = pb.Record()
            rec.ParseFromString(chunk)
            chunk = b""
            if rec.WhichOneof("record_type") == "history":
                out.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
        elif kind == 0:
            break
    return out


@pytest.mark.slow
def test_wandb_offline_logger_receives_the_training_scalars(tmp_path, shared_cache, monkeypatch):
    from outlierlab.jobs.training import train

    monkeypatch.setenv("WANDB_SILENT", "true")
    train(small_cfg(tmp_path, *CELL, "logger=wandb", "logger.wandb.name=cell", "study=wandb_test"))
    import wandb

    wandb.finish()
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60  # wandb's service process writes the file: on a loaded machine, after finish()
    while True:
        losses = {int(h["trainer/global_step"]): h["train/loss"] for h in _wandb_history(run_file)
                  if "train/loss" in h}
        if len(losses) >= 6 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    logged = {int(r["step"]): float(r["train/loss"]) for r in _csv_rows(tmp_path) if r.get("train/loss")}
    assert losses == pytest.approx(logged) and len(losses) == 6


def run_cli(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("OUTLIERLAB_DEBUG", None)
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


SWEEP = [*SMALL, "trainer.limit_val_batches=0", "export=false", "trainer.max_steps=24",
         "callbacks.model_checkpoint.every_n_train_steps=4", "callbacks.progress.every_n_steps=4"]


@pytest.mark.slow
def test_joblib_multirun_skips_finished_and_resumes_killed_cells(tmp_path, shared_cache):
    """2 cells in parallel processes (hydra/launcher=joblib); the sweep is killed (SIGKILL: no goodbye) once
    a cell has a checkpoint; the same command finishes it from that checkpoint to the weights of an
    uninterrupted cell; a third run skips both."""
    from outlierlab.jobs.training import train

    reference = tmp_path / "reference"
    train(small_cfg(reference, *SWEEP, "seed=2", "threads=1"))  # a cell's threads: 2 cores / 2 jobs (bitwise equality)
    sweep = tmp_path / "sweep"
    args = ["-m", "seed=1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}", "threads=1",
            *SWEEP]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 400
    cells = lambda: sorted(p for p in sweep.glob("*seed=*") if p.is_dir())  # noqa: E731
    while time.time() < deadline:
        if any(list((c / "checkpoints").glob("step*.ckpt")) and not (c / "finished.json").exists() for c in cells()):
            break
        assert proc.poll() is None, "the sweep ended before it could be interrupted"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # readable, stable cell names: the overrides, sorted; launcher settings are not part of them
    # (this sweep's many overrides exceed the 150 characters written as is: cut, seed kept, digest appended)
    assert [c.name.split(",")[-2] for c in cells()] == ["seed=1", "seed=2"]
    assert all("hydra" not in c.name and len(c.name) <= 150 and c.name.startswith("callbacks.") for c in cells())
    unfinished = [c for c in cells() if not (c / "finished.json").exists()]
    assert unfinished, "nothing was interrupted"
    r = run_cli(args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming from the last one" in r.stderr + r.stdout
    for c in cells():
        assert json.loads((c / "finished.json").read_text())["global_step"] == 24
    seed2 = next(c for c in cells() if "seed=2" in c.name)
    wa, wb = final_weights(reference), final_weights(seed2)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)
    r = run_cli(args)
    assert r.returncode == 0 and (r.stderr + r.stdout).count("finished earlier") == 2


@pytest.mark.slow
def test_submitit_local_launcher_runs_a_cell(tmp_path, shared_cache):
    sweep = tmp_path / "sweep"
    r = run_cli(["-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep}",
                 *CELL, "seed=3"])
    assert r.returncode == 0, r.stderr[-2000:]
    (cell,) = [p for p in sweep.iterdir() if p.is_dir() and "seed=3" in p.name]
    assert json.loads((cell / "finished.json").read_text())["global_step"] == 6
    assert list((sweep / ".submitit").rglob("*_result.pkl"))  # it really went through submitit


def test_long_cell_names_are_cut_keep_the_seed_and_stay_unique():
    from outlierlab.configuration.composing import cell_dir_name

    assert cell_dir_name("pos=none,seed=2") == "pos=none,seed=2"  # short: the overrides themselves
    assert cell_dir_name("") == "default"  # never the sweep directory itself
    long = ",".join(f"model.option_{i}={i}" for i in range(20)) + ",seed=7,trainer.max_steps=10"
    a, b = cell_dir_name(long), cell_dir_name(long.replace("=10", "=11"))
    assert len(a) <= 150 and a.split(",")[-2] == "seed=7" and a.startswith("model.option_0=0,")
    assert a != b and a == cell_dir_name(long)  # unique and stable


def _cell_name(overrides: list[str]) -> str:
    """The directory name (``hydra.sweep.subdir``) a sweep cell with these overrides gets, as a launcher resolves it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from outlierlab.configuration.composing import register_resolvers
    from tests.conftest import CONFIG_DIR

    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose("train", overrides, return_hydra_config=True)
    return str(OmegaConf.select(cfg, "hydra.sweep.subdir"))


@pytest.mark.parametrize("overrides", [
    ["+posthoc_probe.max_sentences=200", "seed=3"],  # posthoc_probe is null by default: added with +
    ["experiment=objective_positions", "posthoc_probe.max_sentences=200", "seed=3"],  # the experiment sets it
    ["++posthoc_probe.overrides=['data.max_sentences=50','seed=1']", "seed=3", "posthoc=true", "study=x"],
    ["paths.cache_dir=/elsewhere/.cache", "seed=3"],  # where the caches live is not what a cell computes
])
def test_sub_keys_of_an_excluded_key_stay_out_of_the_cell_name(overrides):
    """Hydra's exclude_keys match whole keys: posthoc_probe is excluded, posthoc_probe.max_sentences was not, so
    setting it moved the cell to another directory (and a rerun trained it again instead of skipping it)."""
    name = _cell_name(overrides)
    assert name == "seed=3", name


def test_cell_names_of_other_overrides_are_hydras_override_dirname():
    """Everything but the excluded keys and their sub-keys is named exactly as before (Hydra's sort and join, a
    list value's commas included), so existing cells keep their directories."""
    from outlierlab.configuration.composing import cell_overrides

    overrides = ["seed=3", "model.norm=rmsnorm", "data=files", "data.files=[a.txt,b.txt]",
                 "+posthoc_probe.max_sentences=2", "posthoc_probe_extra=1", "trainer.enable_progress_bar=false",
                 "ckpt_path=last"]
    expected = "data.files=[a.txt,b.txt],data=files,model.norm=rmsnorm,posthoc_probe_extra=1,seed=3"
    excluded = ["posthoc_probe", "trainer.enable_progress_bar", "ckpt_path"]
    assert cell_overrides(overrides, excluded) == expected  # posthoc_probe_extra is not under posthoc_probe
    assert cell_overrides(["a=1", "b=2"], [], item_sep="__", kv_sep="-") == "a-1__b-2"
    assert _cell_name(["seed=3", "model.norm=rmsnorm", "pos=none"]) == "model.norm=rmsnorm,pos=none,seed=3"
    from omegaconf import OmegaConf

    with pytest.raises(Exception, match="takes two arguments"):  # the one-argument form is refused in one line
        OmegaConf.create({"n": "pos=none,seed=2", "d": "${cell_dir:${n}}"}).d


def test_named_studies_carry_their_sweep_and_slurm_preset_resolves():
    """experiment=emergence_seeds is the whole study; hydra/launcher=slurm asks one task per device."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from tests.conftest import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose("train", ["experiment=emergence_seeds", "hydra/launcher=slurm", "trainer.devices=4",
                                      "run_dir=/tmp/x"], return_hydra_config=True)
    assert dict(cfg.hydra.sweeper.params) == {"seed": "1,2,3,4,5", "pos": "learned,none"}  # 5 seeds
    assert list(cfg.study_design.contrasts) == ["pos=learned,none"] and len(cfg.study_design.primary) == 6
    assert cfg.study == "emergence_seeds" and cfg.trainer.max_steps == 4000 and cfg.posthoc is True
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["tasks_per_node"] == 4 and launcher["gpus_per_node"] == 4 and launcher["nodes"] == 1
    assert "SlurmLauncher" in launcher["_target_"] and launcher["signal_delay_s"] > 0


@pytest.mark.parametrize("logger,key", [("mlflow", "logger.mlflow.run_name"), ("wandb", "logger.wandb.name")])
def test_tracker_run_names_are_the_cells_directory_names(logger, key):
    """MLflow / W&B name a run as the cell's directory is named: a re-analysis setting under an excluded key
    (posthoc_probe.max_sentences=200) stays out of the run name too."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from outlierlab.configuration.composing import register_resolvers
    from tests.conftest import CONFIG_DIR

    register_resolvers()
    GlobalHydra.instance().clear()
    overrides = [f"logger={logger}", "+posthoc_probe.max_sentences=200", "pos=none", "seed=2"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose("train", overrides, return_hydra_config=True)
    previous = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)  # what a launched job has: ${hydra:...} resolves against it
    try:
        assert OmegaConf.select(cfg, key) == f"logger={logger},pos=none,seed=2" == _cell_name(overrides)
    finally:
        HydraConfig.instance().cfg = previous


def test_a_slash_in_an_override_value_keeps_the_cell_one_directory():
    """tokenizer.name_or_path=FacebookAI/roberta-base nested the cell two directories deep (Hydra #3018), where the
    study aggregator, which reads a sweep directory's children, never found it."""
    from outlierlab.configuration.composing import cell_dir_name

    name = _cell_name(["tokenizer.name_or_path=FacebookAI/roberta-base", "seed=1"])
    assert name == "seed=1,tokenizer.name_or_path=FacebookAI%2Froberta-base" and "/" not in name
    long = cell_dir_name("data.files=[" + "/very/long/path" * 30 + "],seed=4")
    assert "/" not in long and long.endswith(",seed=4," + long.rsplit(",", 1)[1]) and len(long) <= 255
