"""Checkpoints and exports staged beside their destination, and the free-space check sized from the model
(Lightning issue #21253)."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple

import pytest
import torch

from outlierlab.jobs import checkpoint_io
from outlierlab.jobs.checkpoint_io import (MARGIN_BYTES, StagedCheckpointIO, checkpoint_bytes, checkpoints_kept,
                                           free_bytes_needed, staged_dir)
from tests.conftest import compose
from tests.run_fixtures import CELL
from tests.run_fixtures import final_weights, small_cfg


class Bomb:
    """Pickling this raises: a writer that fails half-way through a checkpoint."""

    def __reduce__(self):
        raise OSError(28, "No space left on device")


def test_a_failed_write_leaves_the_previous_file_and_no_staging_file(tmp_path):
    io = StagedCheckpointIO()
    dest = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"global_step": 3, "w": torch.arange(4.0)}, dest)
    good = dest.read_bytes()
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"global_step": 6, "w": torch.zeros(10_000), "bomb": Bomb()}, dest)
    assert dest.read_bytes() == good and torch.load(dest)["global_step"] == 3
    assert sorted(p.name for p in dest.parent.iterdir()) == ["last.ckpt"]
    with pytest.raises(OSError):
        io.save_checkpoint({"bomb": Bomb()}, tmp_path / "checkpoints" / "step0000006.ckpt")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["last.ckpt"]  # nothing under the new name


@pytest.mark.slow
def test_a_checkpoint_that_fails_mid_run_keeps_last_ckpt_and_resume_equals_a_straight_run(tmp_path, shared_cache,
                                                                                        monkeypatch):
    from outlierlab.jobs.training import train

    straight, failed = tmp_path / "straight", tmp_path / "failed"
    train(small_cfg(straight, *CELL))
    real_save = torch.save

    def full_disk_at_step_6(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("global_step") == 6:
            f.write(b"\0" * 4096)  # half a checkpoint, then the disk is full
            raise OSError(28, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_io.torch, "save", full_disk_at_step_6)
    with pytest.raises(OSError, match="No space left"):
        train(small_cfg(failed, *CELL))
    monkeypatch.setattr(checkpoint_io.torch, "save", real_save)
    ckpts = failed / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step0000003.ckpt"]  # no partial, no step 6
    assert torch.load(ckpts / "last.ckpt", weights_only=False)["global_step"] == 3
    info = json.loads((failed / "failed.json").read_text())
    assert "No space left on device" in info["error"] and info["global_step"] == 6
    train(small_cfg(failed, *CELL))  # the same command: resumes from last.ckpt (step 3)
    assert json.loads((failed / "finished.json").read_text())["global_step"] == 6
    assert not (failed / "failed.json").exists()
    wa, wb = final_weights(straight), final_weights(failed)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)


def test_checkpoint_size_and_free_space_formula():
    layer = torch.nn.Linear(10, 10)  # 110 fp32 parameters
    assert checkpoint_bytes(layer) == 110 * 4 * 3  # weights + Adam's two moments
    assert checkpoint_bytes(layer.to(torch.bfloat16)) == 110 * 2 * 3
    # save_top_k=2 + last.ckpt = 3 kept, + 1 being staged; export = the weights once
    assert free_bytes_needed(1320, 3, 440) == 1320 * 4 + 440 + MARGIN_BYTES
    assert free_bytes_needed(1320, 3, 440, existing=3) == 1320 * 1 + 440 + MARGIN_BYTES  # a resume replaces them
    cfg = compose("train", ["run_dir=/tmp/x"])
    assert checkpoints_kept(cfg) == 3  # configs/callbacks/default.yaml: save_top_k 2 + save_last
    cfg = compose("train", ["run_dir=/tmp/x", "callbacks.model_checkpoint.save_top_k=-1", "trainer.max_steps=1000",
                            "callbacks.model_checkpoint.every_n_train_steps=100"])
    assert checkpoints_kept(cfg) == 11
    assert checkpoints_kept(compose("train", ["run_dir=/tmp/x", "~callbacks.model_checkpoint"])) == 1


def test_too_little_free_space_is_one_line_before_training(tmp_path, shared_cache, monkeypatch):
    from outlierlab.jobs.training import train

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint_io.shutil, "disk_usage", lambda p: usage(2**30, 2**30 - 2**20, 2**20))
    with pytest.raises(OSError) as err:
        train(small_cfg(tmp_path, *CELL))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"only 1 MB free under {tmp_path}") and "save_top_k" in msg
    assert not (tmp_path / "checkpoints").exists()


def test_staged_export_replaces_the_old_one_only_when_complete(tmp_path):
    dest = tmp_path / "hf"
    with staged_dir(dest) as d:
        (d / "config.json").write_text("{}")
    assert (dest / "config.json").read_text() == "{}"
    with pytest.raises(RuntimeError):
        with staged_dir(dest) as d:
            (d / "config.json").write_text('{"half": ')
            raise RuntimeError("export failed")
    assert (dest / "config.json").read_text() == "{}"  # the previous export, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging or moved-aside directory left
    with staged_dir(dest) as d:
        (d / "model.safetensors").write_bytes(b"w")
    assert sorted(p.name for p in dest.iterdir()) == ["model.safetensors"]
    shutil.rmtree(dest)


@pytest.fixture
def small_filesystem(tmp_path):
    """A 5.5 MB tmpfs (root only; skipped elsewhere): room for the step-3 checkpoints, not for step 6's."""
    import subprocess

    mnt = tmp_path / "small_fs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5632k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["staged", "lightning"])
def test_a_full_disk_at_a_checkpoint_leaves_no_torn_file(small_filesystem, writer, shared_cache, monkeypatch):
    """The reported failure for real: the disk fills during the step-6 checkpoint. Lightning's own writer stages in
    $TMPDIR (another file system) and copies, leaving a torn file under the checkpoint's name; ours leaves none."""
    from outlierlab.jobs import training

    monkeypatch.setattr(training, "check_free_space", lambda run_dir, need: None)  # 64 MB margin > this tmpfs
    run = small_filesystem / "run"
    extra = ["+trainer.plugins=[{_target_: lightning.pytorch.plugins.io.TorchCheckpointIO}]"] if writer == "lightning" else []
    with pytest.raises(Exception, match="No space left on device"):
        training.train(small_cfg(run, *CELL, *extra))
    ckpts = {p.name: p for p in (run / "checkpoints").iterdir()}
    good = torch.load(ckpts["step0000003.ckpt"], weights_only=False)
    if writer == "lightning":
        torn = ckpts.get("step0000006.ckpt") or ckpts.get("last.ckpt")
        assert torn is not None and torn.stat().st_size < ckpts["step0000003.ckpt"].stat().st_size, (
            "Lightning's writer no longer leaves a torn file on a full disk: StagedCheckpointIO can go "
            "(Lightning issue #21253)")
        return
    assert sorted(ckpts) == ["last.ckpt", "step0000003.ckpt"]  # nothing under step 6's name, no staging file
    assert torch.load(ckpts["last.ckpt"], weights_only=False)["global_step"] == good["global_step"] == 3
    assert "No space left on device" in json.loads((run / "failed.json").read_text())["error"]
