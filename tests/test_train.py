"""train.py end to end on a small slice of the embedded corpus (CPU)."""

from __future__ import annotations

import csv
import errno
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.conftest import ROOT
from tests.run_fixtures import SMALL, final_weights, small_cfg, train_losses


def test_training_lowers_the_loss_and_exports(tmp_path, shared_cache):
    from outlierlab.jobs.training import train

    cfg = small_cfg(tmp_path, "trainer.max_steps=40", "trainer.val_check_interval=20",
                    "lr=2e-3", "module.scheduler.num_warmup_steps=5")
    metrics = train(cfg)
    losses = train_losses(tmp_path)
    first = sum(losses[s] for s in range(0, 5)) / 5
    last = sum(losses[s] for s in range(35, 40)) / 5
    assert last < first - 0.5, (first, last)  # from ~ln(1000)=6.9 towards unigram level
    assert metrics["val/ppl"] == pytest.approx(float(torch.exp(torch.tensor(metrics["val/loss"]))), rel=1e-4)
    # run directory contract
    assert (tmp_path / "config.yaml").exists()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "hf" / "config.json").exists() and (tmp_path / "hf" / "tokenizer_config.json").exists()
    from transformers import AutoTokenizer, RobertaForMaskedLM

    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    enc = tok("It is a truth universally acknowledged", return_tensors="pt")
    assert enc["input_ids"][0, 0].item() == tok.bos_token_id == 0
    RobertaForMaskedLM.from_pretrained(tmp_path / "hf")(**enc)


@pytest.mark.slow
def test_other_schemes_export_in_our_format(tmp_path, shared_cache):
    from outlierlab.models import load_pretrained
    from outlierlab.jobs.training import train

    train(small_cfg(tmp_path, "pos=rope", "trainer.max_steps=2", "trainer.limit_val_batches=0"))
    assert (tmp_path / "model" / "outlierlab_config.json").exists() and not (tmp_path / "hf").exists()
    assert load_pretrained(tmp_path / "model").config.pos_name == "rope"


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path, shared_cache):
    """10 steps + resume to 20 == 20 straight steps: same losses and weights (CPU, seeded)."""
    from outlierlab.jobs.training import train

    common = ["trainer.limit_val_batches=0", "module.scheduler.num_training_steps=20",
              "module.scheduler.num_warmup_steps=4", "callbacks.model_checkpoint.every_n_train_steps=10"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(small_cfg(straight, "trainer.max_steps=20", *common))
    train(small_cfg(resumed, "trainer.max_steps=10", *common))
    ckpt10 = torch.load(resumed / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt10["global_step"] == 10
    train(small_cfg(resumed, "trainer.max_steps=20", "ckpt_path=last", *common))
    a, b = train_losses(straight), train_losses(resumed)
    assert sorted(b) == list(range(20))  # metrics.csv kept across the resume: no gap, no duplicate
    for step in range(10, 20):
        assert b[step] == pytest.approx(a[step], abs=1e-5), step
    wa, wb = final_weights(straight), final_weights(resumed)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-5), k
    opt_a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=False)["optimizer_states"][0]["state"]
    opt_b = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=False)["optimizer_states"][0]["state"]
    assert opt_a[0]["step"] == opt_b[0]["step"] == 20
    assert torch.allclose(opt_a[0]["exp_avg_sq"], opt_b[0]["exp_avg_sq"], rtol=1e-4, atol=1e-10)


#: One small finished run (4 steps, checkpoints at steps 2 and 4, no export) that several tests below read or copy:
#: trained once per module by :func:`four_steps` instead of once per test.
FOUR_STEPS = ["trainer.max_steps=4", "trainer.limit_val_batches=0", "callbacks.model_checkpoint.every_n_train_steps=2",
              "export=false"]


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory, shared_cache):
    """``(run_dir, warnings)``: the :data:`FOUR_STEPS` run, trained from a fresh directory, and every warning that
    fresh start raised.  Shared: a test that changes the run works on its own copy (:func:`copy_of`)."""
    import warnings

    from outlierlab.jobs.training import train

    run = tmp_path_factory.mktemp("four_steps") / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(small_cfg(run, *FOUR_STEPS))
    return run, [str(w.message) for w in caught]


def copy_of(run: Path, tmp_path: Path) -> Path:
    """A copy of a shared run in this test's own directory (``tmp_path`` itself), to change freely."""
    import shutil

    shutil.copytree(run, tmp_path, dirs_exist_ok=True)
    return tmp_path


@pytest.mark.slow
def test_identical_commands_give_identical_runs(tmp_path, four_steps):
    from outlierlab.jobs.training import train

    a, _ = four_steps  # the same command, trained earlier in this process (another test may have run in between)
    train(small_cfg(tmp_path / "b", *FOUR_STEPS))
    assert train_losses(a) == train_losses(tmp_path / "b")


# ---------------------------------------------------------------------------------------------
# bad input: one clear line
# ---------------------------------------------------------------------------------------------
def test_block_size_larger_than_model_is_refused(tmp_path, shared_cache):
    from outlierlab.jobs.training import train

    with pytest.raises(ValueError, match=r"data.block_size=64 is larger than the model's max_len=32"):
        train(small_cfg(tmp_path, "model.max_len=32"))


def test_missing_checkpoint_is_refused(tmp_path, shared_cache):
    from outlierlab.jobs.training import train

    with pytest.raises(FileNotFoundError, match="ckpt_path=last but .* holds no checkpoint"):
        train(small_cfg(tmp_path, "ckpt_path=last"))
    with pytest.raises(FileNotFoundError, match="ckpt_path /nope.ckpt does not exist"):
        train(small_cfg(tmp_path, "ckpt_path=/nope.ckpt"))


@pytest.mark.slow
def test_checkpoint_of_another_model_is_refused(tmp_path, four_steps):
    from outlierlab.jobs.training import train

    common = ["trainer.limit_val_batches=0", "callbacks.model_checkpoint.every_n_train_steps=2", "export=false"]
    run = copy_of(four_steps[0], tmp_path)  # pos=learned, at step 4
    with pytest.raises(ValueError, match=r"belongs to a different model config \(.*pos: \{'name': 'learned'\} in checkpoint"):
        train(small_cfg(run, "pos=none", "trainer.max_steps=6", "ckpt_path=last", *common))


@pytest.mark.slow
def test_truncated_last_checkpoint_falls_back_to_previous(tmp_path, four_steps):
    from outlierlab.jobs.run_resume import resolve_checkpoint

    copy_of(four_steps[0], tmp_path)  # checkpoints of steps 2 and 4, last.ckpt at step 4
    last = tmp_path / "checkpoints" / "last.ckpt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    path, ckpt = resolve_checkpoint("last", tmp_path)
    assert Path(path).name == "step0000004.ckpt" and ckpt["global_step"] == 4
    with pytest.raises(ValueError, match="is unreadable"):
        resolve_checkpoint(str(last), tmp_path)


@pytest.mark.slow
def test_stale_last_checkpoint_loses_to_a_newer_step(tmp_path, four_steps):
    """A kill during last.ckpt's rewrite leaves the previous last.ckpt (step 2) beside a complete step0000004.ckpt:
    ckpt_path=last resumes after step 4, not step 2 (the newest readable checkpoint by global step)."""
    import shutil

    from outlierlab.jobs.run_resume import resolve_checkpoint

    copy_of(four_steps[0], tmp_path)  # checkpoints of steps 2 and 4, last.ckpt at step 4
    ckpts = tmp_path / "checkpoints"
    shutil.copyfile(ckpts / "step0000002.ckpt", ckpts / "last.ckpt")  # the rewrite to step 4 never landed
    os.utime(ckpts / "last.ckpt", (1e9, 2e9))  # newest file on disk, oldest step inside
    path, ckpt = resolve_checkpoint("last", tmp_path)
    assert Path(path).name == "step0000004.ckpt" and ckpt["global_step"] == 4
    (ckpts / "step0000004.ckpt").unlink()
    path, ckpt = resolve_checkpoint("last", tmp_path)  # a tie at the newest step goes to last.ckpt
    assert Path(path).name in ("last.ckpt", "step0000002.ckpt") and ckpt["global_step"] == 2


def test_staging_files_of_dead_writers_are_removed_at_start(tmp_path):
    from outlierlab.jobs.checkpoint_io import remove_dead_partials

    dead = 2**22 + 12345  # above Linux's default pid_max: never a live process here
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / f"step0000020.ckpt.partial-{dead}").write_bytes(b"x" * 100)
    (tmp_path / f".model.partial-{dead}").mkdir()
    (tmp_path / f".model.partial-{dead}" / "config.json").write_text("{")
    (tmp_path / f".hf.old-{dead}").mkdir()  # killed after moving the previous export aside: it is restored
    (ckpts / f"step0000010.ckpt.partial-{os.getpid()}").write_bytes(b"mine")  # this process's own: kept
    (ckpts / "step0000010.ckpt").write_bytes(b"kept")
    removed = {p.name for p in remove_dead_partials(tmp_path)}
    assert removed == {f"step0000020.ckpt.partial-{dead}", f".model.partial-{dead}"}
    assert (tmp_path / "hf").is_dir() and not (tmp_path / f".hf.old-{dead}").exists()
    assert (ckpts / f"step0000010.ckpt.partial-{os.getpid()}").exists() and (ckpts / "step0000010.ckpt").exists()


def test_nan_loss_stops_with_the_step(tmp_path, shared_cache):
    from outlierlab.lightning_modules.mlm_module import NonFiniteLossError
    from outlierlab.jobs.training import train

    with pytest.raises(NonFiniteLossError, match=r"training loss became nan at global step \d+"):
        train(small_cfg(tmp_path, "trainer.max_steps=30", "trainer.limit_val_batches=0", "export=false",
                        "trainer.gradient_clip_val=null", "lr=1e30",
                        "module.scheduler.num_warmup_steps=0"))


def test_unwritable_run_dir_fails_at_start(tmp_path):
    from outlierlab.jobs.training import ensure_writable

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="is not writable"):
        ensure_writable(blocker / "run")


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OUTLIERLAB_DEBUG"}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_cli_unknown_scheme_is_one_line():
    r = run_cli("pos=nope", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: unknown pos 'nope'; valid: alibi, learned, none, relative, rope, sinusoidal"


def test_cli_missing_text_file_is_one_line(tmp_path, shared_cache):
    r = run_cli("data=files", f"data.files=[{tmp_path}/missing.txt]", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "missing.txt" in lines[-1], r.stderr[-2000:]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_ddp_on_cpu_with_two_processes_in_a_sweep(tmp_path, shared_cache):
    """`-m pos=learned,none trainer=ddp trainer.accelerator=cpu trainer.devices=2`: both jobs train with two
    gloo processes; the DDP children run their parent's job, never a sweep of their own
    (lightning-hydra-template #393), and the second job starts its own process group."""
    sweep = tmp_path / "sweep"
    # run from an empty working directory: a child that started a sweep of its own would write multirun/ there
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "OUTLIERLAB_DEBUG"}, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", "pos=learned,none", "trainer=ddp",
                        "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_steps=3",
                        "trainer.limit_val_batches=0", "callbacks.model_checkpoint.every_n_train_steps=3",
                        f"hydra.sweep.dir={sweep}", *SMALL], cwd=work, capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    import yaml  # cells are named by their overrides (cut, with a digest, when long): read what each ran

    poses = sorted(o.split("=", 1)[1] for j in jobs
                   for o in yaml.safe_load((sweep / j / ".hydra" / "overrides.yaml").read_text()) if o.startswith("pos="))
    assert len(jobs) == 2 and poses == ["learned", "none"]
    for job in jobs:
        assert (sweep / job / "hf" / "config.json").exists()
        ckpt = torch.load(sweep / job / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert ckpt["global_step"] == 3
    assert not (work / "multirun").exists() and not (work / "outputs").exists(), "a DDP child started a sweep of its own"
    assert (r.stdout + r.stderr).count("Launching 2 jobs locally") == 1, "a DDP child started a sweep of its own"
    assert "GLOBAL_RANK: 1" in r.stderr + r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("switch, gain", [("model.norm=rmsnorm", True), ("model.norm=layernorm_noaffine", False),
                                          ("model.block=op", False)])
def test_norm_switches_train_with_the_monitors_on_and_analyse_post_hoc(tmp_path, shared_cache, switch, gain):
    """Every norm kind trains from train.py's default config, LayerNorm monitor included (torch's RMSNorm
    has a gain and no ``bias`` attribute at all, which crashed the monitor's first snapshot), and post-hoc reads it."""
    from outlierlab.monitoring.replay import analyze_run
    from outlierlab.jobs.training import train

    train(small_cfg(tmp_path, switch, "trainer.max_steps=4", "trainer.limit_val_batches=0", "export=false",
                    "callbacks.model_checkpoint.every_n_train_steps=2"))
    with open(tmp_path / "monitor" / "layernorm.csv") as f:
        rows = list(csv.DictReader(f))
    statistics = {r["statistic"] for r in rows if r["name"] == "layer.0.output"}
    if gain:  # RMSNorm: the gain is tracked, and there is no bias to report
        assert {int(r["step"]) for r in rows if r["name"] == "layer.0.output"} >= {0, 4}
        assert any(s.startswith("gain") for s in statistics) and not any(s.startswith("bias") for s in statistics)
    else:  # nothing affine to track: no per-norm rows at all
        assert not statistics
    analyze_run(tmp_path)
    with open(tmp_path / "monitor_posthoc" / "metrics.csv") as f:
        metrics = [r for r in csv.DictReader(f) if r["layer"] != "0"]
    # no-affine norms and the OP block: nothing the rule can judge, an empty cell, never a 0; RMSNorm (no bias) is
    # judged on its gain alone, so every layer has a count
    assert metrics and all((r["n_layernorm_outliers"] != "") == gain for r in metrics)
    assert all(float(r["attn_row_mass"]) == pytest.approx(1.0) for r in metrics)  # softmax rows sum to one


@pytest.mark.slow
def test_resume_false_where_checkpoints_exist_is_refused_and_a_fresh_start_warns_nothing(tmp_path, four_steps):
    """``resume=false`` in a run directory holding an earlier run's checkpoints is refused in one line, its files
    untouched (found: Lightning restored last.ckpt whenever an on-exception checkpoint callback was configured, so
    the "new" run trained zero steps; and with that fixed a second run wrote step*-v1.ckpt and last-v1.ckpt beside
    the first's last.ckpt, which the next resume would have read). A fresh start prints none of Lightning's
    ckpt_path warnings."""
    from outlierlab.jobs.training import train

    common = FOUR_STEPS
    run, fresh_start_warnings = four_steps  # trained from an empty directory, its warnings recorded
    assert not [w for w in fresh_start_warnings if "ckpt_path" in w], fresh_start_warnings
    copy_of(run, tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "checkpoints").iterdir()}
    with pytest.raises(ValueError) as err:
        train(small_cfg(tmp_path, *common, "seed=7", "resume=false", "skip_finished=false"))
    msg = str(err.value)
    assert "\n" not in msg and "resume=false" in msg and "another run_dir" in msg and str(tmp_path) in msg
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "checkpoints").iterdir()} == before


def test_model_summary_counts_the_flops_of_one_training_block(tmp_path, shared_cache, caplog, capsys):
    """Lightning's model summary printed "Total FLOPs: 0" (no example input): train.py gives it one training
    block, and the total is the hand count of one forward: 2·T·(in·out) for every Linear, plus the tied
    decoder's 2·T·d·V (torch's counter counts attention's products only where it knows the kernel: up to
    4·L·T²·d more)."""
    import logging
    import re

    from outlierlab.jobs.training import train

    caplog.set_level(logging.INFO, logger="lightning.pytorch.callbacks.model_summary")
    train(small_cfg(tmp_path, "trainer.enable_model_summary=true", "trainer.max_steps=1", "trainer.limit_val_batches=0",
                    "callbacks=none", "logger=none", "export=false"))
    text = capsys.readouterr().out + "\n".join(r.getMessage() for r in caplog.records)  # Rich table or log
    m = re.search(r"Total FLOPs: ([\d.]+) ?([KMBT]?)|([\d.]+) ?([KMBT]?)\s+Total Flops", text)  # Rich | plain
    value, unit = (m[1], m[2]) if m[1] else (m[3], m[4])
    counted = float(value) * {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[unit]
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tmp_path / "tokenizer"))
    T, d, L, ff = 64, 64, 2, 128
    linear = 2 * T * (L * (4 * d * d + 2 * d * ff) + d * d + d * vocab)  # q, k, v, o, MLP; head dense + decoder
    assert linear * 0.99 <= counted <= (linear + 4 * L * T * T * d) * 1.01, (counted, linear, text[-600:])


class DiskFullAtStep(L.Callback):
    """A callback whose write fails as a full disk does, at one step (the TensorBoard write of a monitor, say)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args, **kwargs):
        if trainer.global_step == self.step:
            raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_mid_run_leaves_failed_json_with_the_folder_and_the_remedy(tmp_path, shared_cache):
    import json

    from outlierlab.jobs.run_errors import error_line
    from outlierlab.jobs.training import train

    with pytest.raises(OSError) as e:
        train(small_cfg(tmp_path, "trainer.max_steps=6", "trainer.limit_val_batches=0", "export=false",
                        f"+callbacks.disk_full._target_={__name__}.DiskFullAtStep", "+callbacks.disk_full.step=2"))
    failed = json.loads((tmp_path / "failed.json").read_text())
    assert failed["global_step"] == 2
    assert failed["error"].startswith(f"no space left on the device writing {tmp_path} (No space left on device): "
                                      "free space there")
    assert not (tmp_path / ".room").exists()  # given up so that failed.json fits on a disk with no byte left
    line = error_line(RuntimeError("unexpected pos 123"), None)  # not a disk error: the plain line
    assert "no space" not in line
    wrapped = RuntimeError("writer failed")
    wrapped.__cause__ = e.value
    assert error_line(wrapped).startswith("no space left on the device (No space left on device)")


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [False, True])
def test_finished_json_records_the_device_and_whether_algorithms_were_deterministic(tmp_path, shared_cache,
                                                                                   deterministic):
    import json

    from outlierlab.jobs.training import train

    before = torch.are_deterministic_algorithms_enabled()
    try:
        train(small_cfg(tmp_path, "trainer.max_steps=2", "trainer.limit_val_batches=0", "export=false",
                        f"trainer.deterministic={str(deterministic).lower()}"))
        assert torch.are_deterministic_algorithms_enabled() is deterministic  # the flag reached torch
    finally:
        torch.use_deterministic_algorithms(before)
    done = json.loads((tmp_path / "finished.json").read_text())
    assert done["accelerator"] == "cpu" and done["deterministic"] is deterministic
