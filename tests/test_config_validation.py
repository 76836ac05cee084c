"""The optimisation setup is validated before the heavy imports: one line, in seconds."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, compose
from outlierlab.jobs.startup import check_train_config, describe_plan


@pytest.mark.parametrize("overrides, message", [
    (["trainer.max_steps=0"], "trainer.max_steps must be >= 1 optimizer steps, got 0"),
    (["trainer.max_steps=-1"], "trainer.max_steps must be >= 1 optimizer steps, got -1"),
    (["trainer.max_steps=2.5"], "trainer.max_steps must be an integer, got 2.5"),
    (["module.scheduler._target_=outlierlab.models.schedules.cosine_typo"], "outlierlab.models.schedules has no 'cosine_typo'"),
    (["module.scheduler._target_=transfromers.get_linear_schedule_with_warmup"], "no module 'transfromers'"),
    (["optimizer._target_=torch.optim.nope.Adam"], "no module 'torch.optim.nope'"),
    (["module.scheduler.num_warmup_steps=-5"], "module.scheduler.num_warmup_steps must be >= 0, got -5"),
    (["callbacks.model_checkpoint.every_n_train_steps=0"], "every_n_train_steps must be >= 1, got 0"),
    (["data.block_size=512"], "data.block_size=512 is larger than the model's max_len=128"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval must be >= 1 batches, got 0"),
    (["resume=no"], "resume must be true or false, got 'no'"),  # the string 'no' read as true: it resumed
    (["export=off"], "export must be true or false, got 'off'"),
    (["seed=abc"], "seed must be an integer, got 'abc'"),
    (["threads=0"], "threads must be >= 1 or null"),
    (["lr=-1"], "lr must be a number > 0, got -1"),
    (["+trainer.max_time=abc"], "trainer.max_time must be DD:HH:MM:SS (e.g. +trainer.max_time=00:02:00:00) or null"),
    (["+trainer.max_time=02:00:00"], "got '02:00:00'"),  # HH:MM:SS: Lightning's Timer refuses it too
    (["+trainer.max_time=00:2:00:00"], "got '00:2:00:00'"),  # one-digit hours: so does its pattern
    (["+trainer.max_time={hours:2}"], "trainer.max_time must be DD:HH:MM:SS"),  # reached it as a DictConfig
])
def test_impossible_settings_fail_with_one_line(overrides, message):
    with pytest.raises(ValueError) as err:
        check_train_config(compose("train", overrides))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("max_steps, expected", [
    (29, "warm-up (30 steps) >= trainer.max_steps (29): the learning rate never decays and never reaches its peak"),
    (30, "warm-up (30 steps) >= trainer.max_steps (30): the learning rate never decays (it holds the peak"),
    (31, None),
])
def test_warmup_at_or_above_max_steps_warns(max_steps, expected):
    cfg = compose("train", [f"trainer.max_steps={max_steps}", "trainer.val_check_interval=10"])
    warnings = check_train_config(cfg)
    warmup = [w for w in warnings if w.startswith("warm-up")]
    assert (warmup == []) if expected is None else (len(warmup) == 1 and warmup[0].startswith(expected))


@pytest.mark.parametrize("gamma, expected", [
    (-0.05, "every attention probability below 0.0476 is clipped to exactly 0, 3.0x the uniform 1/T = 0.0156"),
    (-0.2, "below 0.167 is clipped to exactly 0, 10.7x the uniform"),
    (-0.01, None),  # threshold 0.0099 < 1/64: a uniform row stays alive
    (0.0, None),
])
def test_clipped_softmax_that_zeroes_uniform_attention_warns(gamma, expected):
    cfg = compose("train", ["experiment=emergence_cpu", "model.attention=clipped_softmax", f"model.clip_gamma={gamma}"])
    found = [w for w in check_train_config(cfg) if w.startswith("model.clip_gamma")]
    assert found == [] if expected is None else (len(found) == 1 and expected in found[0] and "\n" not in found[0])


def test_val_check_interval_beyond_the_run_validates_once_at_the_end():
    cfg = compose("train", ["trainer.max_steps=40", "trainer.val_check_interval=100",
                            "trainer.accumulate_grad_batches=2"])
    warnings = check_train_config(cfg)
    assert cfg.trainer.val_check_interval == 80  # batches: 40 steps x 2 accumulation
    assert any("val_check_interval=100 exceeds the run (80 batches)" in w for w in warnings)


def test_valid_defaults_and_experiments_pass_unchanged():
    for overrides in ([], ["experiment=paper_roberta_base"], ["experiment=emergence_cpu"]):
        cfg = compose("train", overrides)
        before = cfg.trainer.val_check_interval
        assert check_train_config(cfg) == []
        assert cfg.trainer.val_check_interval == before


def test_plan_line_of_the_paper_experiment():
    cfg = compose("train", ["experiment=paper_roberta_base", "trainer=ddp", "trainer.devices=4"])
    # Luo et al. Table 4: batch 256 = 32 per device x 4 devices x 2 accumulation; 256 x 512 tokens per step
    assert describe_plan(cfg) == (
        "plan: 200000 steps on auto x 4 device(s) x 1 node(s), global batch 256 = 32 per device x 4 device(s) "
        "x 2 accumulation, 131,072 tokens/step, 26,214,400,000 tokens, precision bf16-mixed, strategy ddp")


def test_validation_imports_nothing_heavy():
    code = ("import sys; sys.path[:0] = ['tests', '.']\n"
            "from conftest import compose\nfrom outlierlab.jobs.startup import check_train_config, describe_plan\n"
            "cfg = compose('train', ['trainer.max_steps=30'])\ncheck_train_config(cfg); describe_plan(cfg)\n"
            "heavy = [m for m in ('torch', 'lightning', 'transformers') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_cli_fails_in_seconds_before_training(tmp_path):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "train.py", "trainer.max_steps=0", f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: trainer.max_steps must be >= 1 optimizer steps, got 0 " \
                                  "(e.g. trainer.max_steps=300)"
    assert time.monotonic() - t0 < 10  # no Lightning/transformers import (≈ 25 s together here)


@pytest.mark.slow
def test_max_steps_equal_to_warmup_trains_to_the_end(cfg_train):
    """The reported crash: max_steps == warm-up divided by zero at the last step."""
    from outlierlab.jobs.training import train

    cfg_train.module.scheduler.num_warmup_steps = cfg_train.trainer.max_steps
    assert check_train_config(cfg_train)  # warns
    metrics = train(cfg_train)
    assert metrics["train/loss"] == metrics["train/loss"]  # finite, not NaN


@pytest.mark.slow
def test_batch_larger_than_the_data_trains_on_what_there_is(tmp_path, shared_cache):
    """A batch larger than the training blocks is not an error: each step sees all blocks (a sensible reading)."""
    from outlierlab.jobs.training import train

    cfg = compose("train", [f"run_dir={tmp_path}", "data.limit_blocks=6", "data.val_blocks=1", "data.batch_size=32",
                            "trainer.max_steps=3", "trainer.val_check_interval=3", "trainer.enable_progress_bar=false",
                            "module.scheduler.num_warmup_steps=1",
                            "model.num_layers=1", "callbacks=none", "logger=none", "export=false"])
    assert check_train_config(cfg) == []
    metrics = train(cfg)
    assert metrics["train/loss"] == metrics["train/loss"] and metrics["val/loss"] < 20
    # callbacks=none means no checkpoints: not Lightning's implicit one either (it wrote epoch=2-step=3.ckpt
    # into the current directory, the repository when tests ran)
    assert not list(tmp_path.rglob("*.ckpt")) and not list(Path.cwd().glob("checkpoints/epoch=*.ckpt"))


@pytest.mark.parametrize("max_steps, warns", [(40, True), (99, True), (100, False), (300, False)])
def test_a_run_shorter_than_the_checkpoint_interval_says_it_has_nothing_to_resume(max_steps, warns):
    cfg = compose("train", [f"trainer.max_steps={max_steps}", "callbacks.model_checkpoint.every_n_train_steps=100",
                            "trainer.val_check_interval=10"])
    found = [w for w in check_train_config(cfg) if "shorter than the checkpoint interval" in w]
    assert (len(found) == 1 and f"trainer.max_steps={max_steps}" in found[0]) if warns else found == []
