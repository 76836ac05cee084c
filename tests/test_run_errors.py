"""Every start-up failure in one line (errors inside Hydra's instantiate unwrapped) and a sweep that survives a
failing cell."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from outlierlab.jobs import run_errors
from outlierlab.jobs.run_errors import error_line, run_main
from outlierlab.utils.dir_lock import lock_run_dir
from outlierlab.jobs.run_state import failed_run, finished_run
from tests.run_fixtures import SMALL
from tests.run_fixtures import cli, one_error

HIDDEN_130 = ("hidden_size=130 is not divisible by num_heads=4 (in model: change it with model.hidden_size=... or "
              "model.num_heads=...)")


def early(hidden: int, heads: int = 4) -> str:
    """train.py's start-up check says it before data and model load (check_train_config)."""
    return (f"model.hidden_size={hidden} is not divisible by model.num_heads={heads}; change one of them "
            f"(e.g. model.hidden_size={hidden - hidden % heads})")


def instantiate_error(node: dict, key: str) -> Exception:
    import hydra

    cfg = OmegaConf.create({key: node})
    with pytest.raises(Exception) as err:
        hydra.utils.instantiate(cfg[key])
    return err.value


def test_a_constructor_rejecting_the_config_is_its_root_cause_and_the_override():
    exc = instantiate_error({"_target_": "outlierlab.models.EncoderConfig", "hidden_size": 130, "num_heads": 4},
                            "model")
    assert type(exc).__name__ == "InstantiationException" and "full_key: model" in str(exc)  # Hydra's 3 lines
    assert error_line(exc) == HIDDEN_130


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_missing_accelerator_is_one_line_with_the_fix():
    exc = instantiate_error({"_target_": "lightning.pytorch.Trainer", "accelerator": "gpu", "logger": False},
                            "trainer")
    assert error_line(exc) == ("No supported gpu backend found! (run on the CPU with trainer.accelerator=cpu, or "
                               "trainer.accelerator=auto to take what is there)")


def test_run_main_prints_one_line_and_exits_1_unless_a_full_trace_is_asked_for(capsys, monkeypatch):
    monkeypatch.delenv("OUTLIERLAB_DEBUG", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    exc = instantiate_error({"_target_": "outlierlab.models.EncoderConfig", "hidden_size": 130, "num_heads": 4},
                            "model")

    def job(cfg):
        raise exc

    with pytest.raises(SystemExit) as stop:
        run_main(job, None)
    assert stop.value.code == 1 and capsys.readouterr().err == f"error: {HIDDEN_130}\n"
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(type(exc)):
        run_main(job, None)


def test_a_bug_is_not_hidden_as_a_user_error(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)

    def job(cfg):
        raise KeyError("internal")

    with pytest.raises(KeyError):  # a traceback (Hydra prints it), not a one-line "error:"
        run_main(job, None)



@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cli_accelerator_without_a_gpu(tmp_path):
    r = cli("train.py", [f"hydra.run.dir={tmp_path}", "trainer.accelerator=gpu", *SMALL, "trainer.max_steps=2"])
    assert r.returncode == 1
    assert one_error(r.stderr) == ("error: No supported gpu backend found! (run on the CPU with "
                                   "trainer.accelerator=cpu, or trainer.accelerator=auto to take what is there)")
    assert failed_run(tmp_path)["error"].startswith("No supported gpu backend found!")


def test_cli_constructor_rejected_config(tmp_path):
    r = cli("train.py", [f"hydra.run.dir={tmp_path}", *SMALL, "model.hidden_size=130", "model.num_heads=4",
                         "trainer.max_steps=2"])
    assert r.returncode == 1 and one_error(r.stderr) == f"error: {early(130)}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cli_evaluate_on_a_missing_gpu(tmp_path):
    r = cli("evaluate.py", [f"hydra.run.dir={tmp_path}", "encoder.device=cuda", "analyses=[outliers]"])
    assert r.returncode == 1 and one_error(r.stderr) == (
        "error: encoder.device=cuda but this machine has no CUDA GPU; use encoder.device=auto (a GPU when there "
        "is one) or encoder.device=cpu")


@pytest.mark.slow
def test_a_sweep_survives_a_failing_cell_and_skips_a_held_one(tmp_path, shared_cache):
    """Four cells: s1's hidden size 66 is rejected (4 heads), s3's directory is held by this process; s0 and s2
    train to the end, s1 gets failed.json, s3 is left alone; the sweep lists both and exits 1."""
    sweep = tmp_path / "sweep"
    (sweep / "s3").mkdir(parents=True)
    args = ["-m", *SMALL, "model.hidden_size=64,66,68,72", "model.num_heads=4", f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=s${hydra.job.num}", "trainer.max_steps=2", "trainer.limit_val_batches=0",
            "export=false"]
    with lock_run_dir(sweep / "s3"):
        r = cli("train.py", args)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert [finished_run(sweep / s) is not None for s in ("s0", "s1", "s2", "s3")] == [True, False, True, False]
    failed = json.loads((sweep / "s1" / "failed.json").read_text())
    assert failed["error"] == early(66) and failed["global_step"] is None
    assert failed_run(sweep / "s1") == failed and failed_run(sweep / "s0") is None
    # a held cell: only what Hydra writes before any job code runs (its .hydra/ and the log), no training files
    assert sorted(p.name for p in (sweep / "s3").iterdir()) == [".hydra", "train.log"]
    lines = r.stderr.splitlines()
    assert f"failed: {sweep / 's1'}: {early(66)}" in lines
    assert f"skipped (held by another process): {sweep / 's3'}" in lines
    assert not (sweep / ".sweep_outcomes").exists()


def test_a_two_line_lightning_message_is_kept_whole_with_its_fix():
    class MisconfigurationException(Exception):  # Lightning's, by name (nothing heavy imported)
        pass

    exc = MisconfigurationException("You requested gpu: [0, 1]\n But your machine only has: [0]")
    assert error_line(exc) == ("You requested gpu: [0, 1] But your machine only has: [0] (lower trainer.devices, or "
                               "trainer.devices=auto to use every device there is)")
    assert error_line(ValueError("x" * 1000)) == "x" * 397 + "..."


@pytest.mark.slow
def test_an_evaluate_sweep_survives_a_failing_cell(tmp_path):
    """The same for evaluate.py (configs/evaluate.yaml selects the callback): cuda:99 fails in one line, cpu runs."""
    sweep = tmp_path / "sweep"
    r = cli("evaluate.py", ["-m", "encoder.device=cuda:99,cpu", "analyses=[outliers]", "data.max_sentences=50",
                            "transform=[none]", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=c${hydra.job.num}"])
    assert r.returncode == 1, r.stderr[-2000:]
    error = json.loads((sweep / "c0" / "failed.json").read_text())["error"]
    assert error.startswith("encoder.device=cuda:99 but this machine has ")
    assert (sweep / "c1" / "outliers.csv").is_file() and not (sweep / "c1" / "failed.json").exists()
    assert f"failed: {sweep / 'c0'}: {error}" in r.stderr.splitlines()
