"""A train.py run directory says what the run holds at every state of its life: stopped by ``max_time``, stopped by
a signal, failed, finished and given more steps, re-entered at the same budget, resumed with other settings.

Each test walks one lifecycle on the suite's small model (``tests/test_train.py::small_cfg``) and reads the files a
reader takes as the run's state: ``finished.json``, ``failed.json``, ``manifest.json``, ``config.yaml``, the export
and its model card, and what ``encoder.name_or_path=<run>`` loads."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from outlierlab.jobs import export_run, run_resume, run_state
from outlierlab.jobs.run_state import failed_run, finished_run, verify_manifest
from tests.run_fixtures import make_cell
from tests.run_fixtures import small_cfg

# every test trains and resumes the small model end to end: the full suite's, not the fast tier's
pytestmark = pytest.mark.slow

#: Every step checkpointed (a resume starts where the run stopped); no validation but where a test asks for it.
COMMON = ("trainer.limit_val_batches=0", "callbacks.model_checkpoint.every_n_train_steps=1")
STOP = "+callbacks.stop._target_=tests.test_run_lifecycle.StopAt"


class StopAt(L.Callback):
    """Ends training after optimizer step ``step``: ``how=timer`` as Lightning's Timer does when ``max_time`` is
    spent (``trainer.should_stop`` set in ``on_train_batch_end``), ``how=signal`` as SIGTERM does (Lightning's
    signal flag: ``SIGTERMException`` at the end of the step), ``how=fail`` with an error."""

    def __init__(self, step: int, how: str) -> None:
        self.step, self.how = int(step), how

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step < self.step:
            return
        if self.how == "timer":
            trainer.should_stop = True
        elif self.how == "signal":
            trainer._signal_connector.received_sigterm = True
        else:
            raise RuntimeError(f"failed at step {trainer.global_step}")


def stop_at(step: int, how: str) -> tuple[str, ...]:
    return STOP, f"+callbacks.stop.step={step}", f"+callbacks.stop.how={how}"


def last_step(run: Path) -> int:
    return int(torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"])


def loads_as(run: Path) -> str:
    """What ``encoder.name_or_path=<run>`` (probe.py, evaluate.py, ``ol.load_encoder``) loads: its folder or file."""
    from outlierlab.models.encoder_source import resolve_encoder

    return Path(resolve_encoder(str(run)).model).name


def card_steps(export: Path) -> str:
    return next(line for line in (export / "README.md").read_text().splitlines() if line.startswith("* **Steps:**"))


def test_a_run_stopped_by_max_time_and_resumed_states_what_it_holds_at_each_state(tmp_path, shared_cache):
    """(a) The Timer's stop runs the run's end (export, card) but leaves it unfinished; the resume with a larger
    budget removes that export (a copy of the checkpoint it resumes from) and ends with a new one."""
    from outlierlab.jobs import training

    training.train(small_cfg(tmp_path, "trainer.max_steps=4", *COMMON, *stop_at(2, "timer")))
    assert finished_run(tmp_path) is None and not (tmp_path / "manifest.json").exists() and failed_run(tmp_path) is None
    assert last_step(tmp_path) == 2 and loads_as(tmp_path) == "hf"  # the export holds the step last.ckpt holds
    assert card_steps(tmp_path / "hf") == "* **Steps:** 2 of max_steps 4 (stopped early)"
    assert not (tmp_path / "monitor_posthoc").exists()
    # the card rewritten later (export_run) still states the step the export holds: the run has no finished.json
    export_run.export_run(tmp_path)
    assert card_steps(tmp_path / "hf") == "* **Steps:** 2 of max_steps 4 (stopped early)"

    training.train(small_cfg(tmp_path, "trainer.max_steps=4", *COMMON))  # the larger max_time: to the end
    assert finished_run(tmp_path)["global_step"] == 4 and verify_manifest(tmp_path) == []
    assert card_steps(tmp_path / "hf") == "* **Steps:** 4 of max_steps 4"
    # the stop's export was a copy of the step-2 checkpoint the resume started from: not kept as a second model
    assert sorted(p.name for p in tmp_path.iterdir() if "hf" in p.name) == ["hf"]
    with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
        logged = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert logged == [0, 1, 2, 3]  # one training row per step: none repeated across the stop


def test_a_run_stopped_before_its_first_checkpoint_interval_keeps_one_last_ckpt(tmp_path, shared_cache):
    """A SIGTERM before the first ``every_n_train_steps`` leaves a last.ckpt the interrupt wrote, which Lightning's
    ModelCheckpoint never did: resumed past the interval, it saved ``last-v1.ckpt`` beside it and kept writing there,
    while ``encoder.name_or_path=<run>`` (and every reader by name) took the stale last.ckpt."""
    from outlierlab.jobs import training

    every3 = ("trainer.limit_val_batches=0", "callbacks.model_checkpoint.every_n_train_steps=3")
    with pytest.raises(SystemExit):
        training.train(small_cfg(tmp_path, "trainer.max_steps=8", *every3, *stop_at(2, "signal")))
    assert last_step(tmp_path) == 2
    with pytest.raises(SystemExit):
        training.train(small_cfg(tmp_path, "trainer.max_steps=8", *every3, *stop_at(7, "signal")))
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt"))
    assert "last-v1.ckpt" not in names and last_step(tmp_path) == 7, names


def test_a_failed_run_resumed_and_stopped_by_a_signal_is_not_read_as_failed(tmp_path, shared_cache):
    """(b) failed.json tells how the last attempt ended: a resume stopped by SIGTERM is interrupted, not failed
    (it kept the earlier attempt's error, and ``failed_run`` returned it)."""
    from outlierlab.jobs import training

    with pytest.raises(RuntimeError, match="failed at step 2"):
        training.train(small_cfg(tmp_path, "trainer.max_steps=6", *COMMON, *stop_at(2, "fail")))
    assert failed_run(tmp_path)["global_step"] == 2

    with pytest.raises(SystemExit) as stopped:
        training.train(small_cfg(tmp_path, "trainer.max_steps=6", *COMMON, *stop_at(4, "signal")))
    assert stopped.value.code == training.SIGTERM_EXIT and last_step(tmp_path) == 4
    assert failed_run(tmp_path) is None and not (tmp_path / "failed.json").exists() and finished_run(tmp_path) is None
    assert loads_as(tmp_path) == "last.ckpt"

    with pytest.raises(RuntimeError, match="failed at step 5"):  # a new failure is recorded as before
        training.train(small_cfg(tmp_path, "trainer.max_steps=6", *COMMON, *stop_at(5, "fail")))
    assert failed_run(tmp_path)["global_step"] == 5


def test_a_finished_run_given_more_steps_drops_its_manifest_and_export_until_its_new_end(tmp_path, shared_cache,
                                                                                        monkeypatch):
    """(c) manifest.json describes the files of the end that wrote it: an extended run stopped before its new end
    kept it, and the study aggregator, which trusts a cell with a manifest to be checked by it, then skipped the
    CSV checks of the cell it admits with ``--until`` (a CSV cut mid-row passed).  Its export goes the same way:
    ``hf/`` must not keep claiming to be the run (the loader would take the step-2 model over last.ckpt).  Once
    finished at its new end, (c, shorter) re-run with a smaller ``trainer.max_steps`` is refused: it rewrote
    finished.json as "4 of 2" and config.yaml as a 2-step run, and a study of 2-step cells counted a 4-step model.

    One run walks all three (they were three tests training the same 2-step run, the same killed resume to 4 and
    the same finished 4-step run): the export's half was ``tests/test_run_state.py``'s
    ``test_a_resumed_run_stopped_before_its_end_loads_as_its_last_checkpoint``, the refusal
    ``test_a_finished_run_resumed_with_a_smaller_budget_is_refused``."""
    from outlierlab.jobs import training
    from outlierlab.models.encoder_source import resolve_encoder
    from outlierlab.studies.cell_checks import check_cell

    training.train(small_cfg(tmp_path, "trainer.max_steps=2", *COMMON))
    assert verify_manifest(tmp_path) == []
    assert Path(resolve_encoder(str(tmp_path)).model).name == "hf" and finished_run(tmp_path)["global_step"] == 2

    def killed(*args, **kwargs):  # the process dies after training, before its end (and its end's export)
        raise RuntimeError("killed before the end")

    monkeypatch.setattr(training, "_finish", killed)
    with pytest.raises(RuntimeError, match="killed"):
        training.train(small_cfg(tmp_path, "trainer.max_steps=4", *COMMON))
    assert finished_run(tmp_path) is None and not (tmp_path / "manifest.json").exists()
    assert not (tmp_path / "hf").exists()
    src = resolve_encoder(str(tmp_path))
    assert src.kind == "ckpt" and Path(src.model).name == "last.ckpt"
    card = (tmp_path / "hf.before-resume-at-step2" / "README.md").read_text()
    assert "**Steps:** 2 of max_steps 2" in card  # the earlier export, kept whole under its new name
    metrics = tmp_path / "csv" / "metrics.csv"
    whole = metrics.read_bytes()
    metrics.write_bytes(whole[:-5])  # cut mid-row, as a copy or a full disk leaves it
    problems, _, _ = check_cell(tmp_path, ["csv/metrics.csv"])
    assert problems == [f"{tmp_path}: csv/metrics.csv: truncated (last line has no newline: cut mid-row)"]
    metrics.write_bytes(whole)

    monkeypatch.undo()
    training.train(small_cfg(tmp_path, "trainer.max_steps=4", *COMMON))  # its end: a new export, the run finished
    assert finished_run(tmp_path)["global_step"] == 4 and verify_manifest(tmp_path) == []
    assert run_state.read_json(tmp_path / "manifest.json")["global_step"] == 4
    assert Path(resolve_encoder(str(tmp_path)).model).name == "hf"
    assert "**Steps:** 4 of max_steps 4" in (tmp_path / "hf" / "README.md").read_text()

    # (c, shorter): finished at step 4, re-run with trainer.max_steps=2
    with pytest.raises(ValueError, match=r"last\.ckpt holds step 4, past trainer\.max_steps=2: a resume cannot "
                                         r"shorten a run; give trainer\.max_steps>=4, or train 2 steps in another"):
        training.train(small_cfg(tmp_path, "trainer.max_steps=2", *COMMON))
    assert finished_run(tmp_path)["max_steps"] == 4 and verify_manifest(tmp_path) == []


def test_a_finished_run_reentered_at_its_budget_keeps_its_final_metrics(tmp_path, shared_cache):
    """(d) ``skip_finished=false`` re-enters a finished run at its last step: nothing trains or validates, and its
    end rewrote finished.json with no metrics (train() returned {})."""
    from outlierlab.jobs import training

    val = ("trainer.limit_val_batches=1", "trainer.val_check_interval=2")
    first = training.train(small_cfg(tmp_path, "trainer.max_steps=2", *COMMON, *val))
    assert {"val/loss", "val/ppl"} <= set(first) and finished_run(tmp_path)["metrics"] == first
    again = training.train(small_cfg(tmp_path, "trainer.max_steps=2", "skip_finished=false", *COMMON, *val))
    assert again == first and finished_run(tmp_path)["metrics"] == first
    assert finished_run(tmp_path)["global_step"] == 2 and verify_manifest(tmp_path) == []
    assert card_steps(tmp_path / "hf") == "* **Steps:** 2 of max_steps 2"


def test_mark_finished_keeps_the_metrics_of_an_earlier_end_at_the_same_step(tmp_path):
    cell = make_cell(tmp_path)  # finished at step 20 of 20 with val/ppl 329.7
    assert run_state.mark_finished(cell, 20, 20, {}, {"seed": 1}) == {"val/ppl": 329.7}
    assert finished_run(cell)["metrics"] == {"val/ppl": 329.7}
    assert run_state.mark_finished(cell, 20, 20, {"val/loss": 5.8}, None) == {"val/ppl": 329.7, "val/loss": 5.8}
    assert run_state.mark_finished(cell, 30, 30, {}, None) == {}  # a later step: another model, no older metric
    assert finished_run(cell)["metrics"] == {}


def test_a_resume_refuses_optimizer_settings_its_checkpoint_would_override(tmp_path, shared_cache):
    """(e) A resume restores the checkpoint's optimizer state: ``optimizer.lr=0.05`` trained on at 7e-4 while
    config.yaml (and the manifest, the card) said 0.05. Refused in one line before anything is written."""
    from outlierlab.jobs import training

    training.train(small_cfg(tmp_path, "trainer.max_steps=2", *COMMON))
    config = (tmp_path / "config.yaml").read_text()
    with pytest.raises(ValueError, match=r"trained with other optimizer settings: optimizer\.lr=0\.05 "
                                         r"\(the checkpoint's: 0\.0007\); a resume restores its optimizer state"):
        training.train(small_cfg(tmp_path, "trainer.max_steps=4", "optimizer.lr=0.05", *COMMON))
    assert (tmp_path / "config.yaml").read_text() == config and finished_run(tmp_path)["global_step"] == 2
    assert (tmp_path / "hf").is_dir() and last_step(tmp_path) == 2
    # a changed schedule takes effect (the scheduler's factor is rebuilt from the config): not refused, recorded
    warmup = yaml.safe_load(config)["module"]["scheduler"]["num_warmup_steps"]
    assert warmup != 1
    training.train(small_cfg(tmp_path, "trainer.max_steps=4", "module.scheduler.num_warmup_steps=1", *COMMON))
    assert finished_run(tmp_path)["global_step"] == 4
    starts = run_state.code_versions(tmp_path)
    assert [s["global_step_at_start"] for s in starts] == [0, 2] and "config_changes" not in starts[0]
    # config.yaml now states the last start's settings; the start that changed them says from what
    assert starts[1]["config_changes"] == {"module.scheduler.num_training_steps": [2, 4],  # ${trainer.max_steps}
                                           "module.scheduler.num_warmup_steps": [warmup, 1], "trainer.max_steps": [2, 4]}
    card = (tmp_path / "hf" / "README.md").read_text()
    assert (f"settings changed at this resume: `module.scheduler.num_training_steps` 2 → 4, "
            f"`module.scheduler.num_warmup_steps` {warmup!r} → 1, `trainer.max_steps` 2 → 4") in card
    # each start is recorded, and the resumed run finishes with a clean manifest of its last start's settings (was
    # tests/test_run_state.py's test_a_training_run_records_each_start_and_finishes_with_a_clean_manifest, which
    # trained the same 2 steps and resumed them)
    lines = [json.loads(x) for x in (tmp_path / "code_versions.jsonl").read_text().splitlines()]
    assert [x["global_step_at_start"] for x in lines] == [0, 2]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert (manifest["global_step"], manifest["max_steps"], manifest["config"]["trainer"]["max_steps"]) == (4, 4, 4)
    assert manifest["code_versions"] == lines and "csv/metrics.csv" in manifest["files"]
    assert verify_manifest(tmp_path) == []


def test_a_resume_that_failed_at_once_is_not_the_baseline_of_the_next_ones_changes(tmp_path, shared_cache,
                                                                                  monkeypatch):
    """A resume that fails before its first step (an OOM after raising the batch size) still wrote its config.yaml;
    the next start's ``config_changes`` compare against the settings the checkpoint trained with, not those."""
    from outlierlab.jobs import training

    training.train(small_cfg(tmp_path, "trainer.max_steps=2", *COMMON))
    warmup = yaml.safe_load((tmp_path / "config.yaml").read_text())["module"]["scheduler"]["num_warmup_steps"]
    assert warmup != 1

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    with monkeypatch.context() as m:
        m.setattr(L.Trainer, "fit", out_of_memory)
        with pytest.raises(RuntimeError, match="out of memory"):
            training.train(small_cfg(tmp_path, "trainer.max_steps=4", "module.scheduler.num_warmup_steps=1", *COMMON))
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["module"]["scheduler"]["num_warmup_steps"] == 1
    training.train(small_cfg(tmp_path, "trainer.max_steps=4", *COMMON))
    assert finished_run(tmp_path)["global_step"] == 4
    starts = run_state.code_versions(tmp_path)
    assert [s["global_step_at_start"] for s in starts] == [0, 2, 2]
    assert starts[1]["config_changes"]["module.scheduler.num_warmup_steps"] == [warmup, 1]
    # what trained from step 2 differs from what trained to step 2 only in the budget
    assert starts[2]["config_changes"] == {"module.scheduler.num_training_steps": [2, 4], "trainer.max_steps": [2, 4]}


def test_optimizer_settings_ignored_compares_the_first_group_and_its_peak_rate():
    groups = [{"lr": 9.3e-5, "initial_lr": 7e-4, "betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.01},
              {"lr": 9.3e-5, "initial_lr": 7e-4, "betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.0}]
    ckpt = {"optimizer_states": [{"param_groups": groups}]}
    same = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 7.0e-4, "betas": [0.9, 0.98], "eps": 1e-6,
            "weight_decay": 0.01}
    assert run_resume.optimizer_settings_ignored(ckpt, same) == []  # a YAML list is the checkpoint's tuple
    assert run_resume.optimizer_settings_ignored(ckpt, {**same, "lr": 1e-3, "betas": [0.9, 0.999], "amsgrad": True}) == [
        "optimizer.lr=0.001 (the checkpoint's: 0.0007)",
        "optimizer.betas=[0.9, 0.999] (the checkpoint's: (0.9, 0.98))"]  # amsgrad: not in the groups
    no_scheduler = {"optimizer_states": [{"param_groups": [{"lr": 7e-4, "weight_decay": 0.01}]}]}
    assert run_resume.optimizer_settings_ignored(no_scheduler, {"lr": 7e-4, "weight_decay": 0.1}) == [
        "optimizer.weight_decay=0.1 (the checkpoint's: 0.01)"]
    assert run_resume.optimizer_settings_ignored({}, same) == [] and run_resume.optimizer_settings_ignored(ckpt, None) == []


def test_a_run_rolled_back_to_an_earlier_checkpoint_never_continues_the_abandoned_steps(tmp_path, shared_cache):
    """(e, another checkpoint) ``ckpt_path=<run>/checkpoints/step0000002.ckpt`` in a run at step 5: stopped at
    step 4, the next resume took the abandoned step-5 checkpoint (the newest step) and logged no step 4; Lightning
    wrote the new timeline's checkpoints as ``step…-v1.ckpt`` beside the abandoned ones."""
    from outlierlab.jobs import checkpoint_probes, training

    every = ("callbacks.model_checkpoint.save_top_k=-1", *COMMON)
    with pytest.raises(SystemExit):
        training.train(small_cfg(tmp_path, "trainer.max_steps=8", *every, *stop_at(5, "signal")))
    probes = tmp_path / "probe_posthoc"
    for step in (2, 5):  # a probe pass over the first timeline (a stand-in for its outputs: one table per step)
        (probes / f"step{step:07d}").mkdir(parents=True)
        (probes / f"step{step:07d}" / "position_probe.csv").write_text(f"layer,accuracy\n1,0.{step}\n")
    checkpoint_probes.gather(probes, [2, 5])
    (tmp_path / "monitor_posthoc").mkdir()

    with pytest.raises(SystemExit):
        training.train(small_cfg(tmp_path, "trainer.max_steps=8", f"ckpt_path={tmp_path}/checkpoints/step0000002.ckpt",
                                 *every, *stop_at(4, "signal")))
    top = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt"))
    assert top == ["last.ckpt", "step0000001.ckpt", "step0000002.ckpt", "step0000003.ckpt", "step0000004.ckpt"]
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "abandoned-after-step2").iterdir()) == [
        "last.ckpt", "step0000003.ckpt", "step0000004.ckpt", "step0000005.ckpt"]  # last.ckpt: the step-5 one
    assert (probes / "abandoned-after-step2" / "step0000005").is_dir() and not (probes / "step0000005").exists()
    assert (probes / "position_probe.csv").read_text() == "step,layer,accuracy\n2,1,0.2\n"
    assert (tmp_path / "monitor_posthoc.before-resume-at-step2").is_dir() and not (tmp_path / "monitor_posthoc").exists()

    training.train(small_cfg(tmp_path, "trainer.max_steps=8", *every))  # resumes the new timeline at step 4
    with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
        assert [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")] == list(range(8))
    assert last_step(tmp_path) == 8 and finished_run(tmp_path)["global_step"] == 8
    assert not list((tmp_path / "checkpoints").glob("*-v*.ckpt"))


def test_a_finished_run_rolled_back_to_its_initial_checkpoint_is_unfinished_until_its_new_end(
        tmp_path, shared_cache, monkeypatch):
    """``ckpt_path=<run>/checkpoints/step0000000.ckpt`` (the initialisation the checkpoint probes read): training
    from step 0 again kept the finished marker, the manifest and the export of the abandoned end."""
    from outlierlab.jobs import training

    init = ("+callbacks.initial_checkpoint._target_="
            "outlierlab.lightning_modules.callbacks.initial_checkpoint.InitialCheckpoint",
            f"+callbacks.initial_checkpoint.dirpath={tmp_path}/checkpoints", *COMMON)
    training.train(small_cfg(tmp_path, "trainer.max_steps=2", *init))
    assert finished_run(tmp_path)["global_step"] == 2 and loads_as(tmp_path) == "hf"

    def killed(*args, **kwargs):  # the process dies after training, before its end
        raise RuntimeError("killed before the end")

    monkeypatch.setattr(training, "_finish", killed)
    with pytest.raises(RuntimeError, match="killed"):
        training.train(small_cfg(tmp_path, "trainer.max_steps=2", f"ckpt_path={tmp_path}/checkpoints/step0000000.ckpt",
                                 *init))
    assert finished_run(tmp_path) is None and not (tmp_path / "manifest.json").exists()
    assert loads_as(tmp_path) == "last.ckpt" and (tmp_path / "hf.before-resume-at-step0").is_dir()
