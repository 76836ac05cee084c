"""outlierlab.models.checkpoint.read_checkpoint: the one reader of checkpoint files (training resume, loading, post-hoc)."""

import pytest
import torch
from omegaconf import OmegaConf

from outlierlab.models.checkpoint import read_checkpoint


def test_reads_plain_and_hparams_with_python_objects(tmp_path):
    plain = tmp_path / "plain.ckpt"
    torch.save({"global_step": 7, "state_dict": {"w": torch.arange(3.0)}}, plain)
    got = read_checkpoint(plain, mmap=True)
    assert got["global_step"] == 7 and torch.equal(got["state_dict"]["w"], torch.arange(3.0))
    # our own runs keep omegaconf containers in hyper_parameters: the safe unpickler refuses them
    rich = tmp_path / "rich.ckpt"
    torch.save({"global_step": 3, "hyper_parameters": {"model": OmegaConf.create({"num_layers": 2})}}, rich)
    with pytest.raises(Exception):
        torch.load(rich, weights_only=True)
    assert read_checkpoint(rich)["hyper_parameters"]["model"]["num_layers"] == 2


def test_truncated_file_is_one_line_value_error(tmp_path):
    good = tmp_path / "good.ckpt"
    torch.save({"global_step": 1, "x": torch.zeros(1000)}, good)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"checkpoint .*bad\.ckpt is unreadable") as e:
        read_checkpoint(bad, mmap=True)
    assert "\n" not in str(e.value)
