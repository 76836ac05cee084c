"""Checkpoints and exports written like the rest of our files: staged beside their destination.

Lightning's ``TorchCheckpointIO`` stages under ``$TMPDIR`` and moves the file, a copy across file systems that a full
disk leaves torn (Lightning #21253, PR #21744; remove ``StagedCheckpointIO`` once a release carries the fix).  Also the
free-space check and the staged exports.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from outlierlab.jobs.run_errors import os_error_in
from outlierlab.utils.atomic import fsync_dir, replace_dir
from outlierlab.utils.dir_lock import pid_alive

log = logging.getLogger(__name__)

#: Room kept free beyond checkpoints and export, for logs, monitor CSVs and the tokenizer.
MARGIN_BYTES = 64 * 2**20


class StagedCheckpointIO(TorchCheckpointIO):
    """``torch.save`` staged beside the destination, fsync, ``os.replace``; remote paths: Lightning's writer."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.partial-{os.getpid()}")
        try:
            with open(tmp, "wb") as fh:
                torch.save(checkpoint, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            cause = os_error_in(e)
            if cause is not None and cause is not e:  # torch's zip writer hides ENOSPC under 'unexpected pos'
                raise OSError(cause.errno, f"cannot write checkpoint {path}: {cause.strerror}") from e
            raise
        fsync_dir(path.parent)


def checkpoint_bytes(module: torch.nn.Module, optimizer_states: int = 2) -> int:
    """Approximate bytes of one checkpoint: the parameters plus Adam's two moments, at their element size."""
    return sum(p.numel() * p.element_size() for p in module.parameters()) * (1 + optimizer_states)


def checkpoints_kept(cfg) -> int:
    """Checkpoint files a run keeps at once: ``save_top_k`` (-1: all) plus ``last.ckpt``; 1 without one."""
    from omegaconf import OmegaConf

    mc = OmegaConf.select(cfg, "callbacks.model_checkpoint")
    if mc is None:
        return 1
    top_k = int(mc.get("save_top_k", 1))
    if top_k < 0:
        every = int(mc.get("every_n_train_steps") or 1)
        top_k = max(1, int(OmegaConf.select(cfg, "trainer.max_steps") or 1) // every)
    return top_k + (1 if mc.get("save_last") else 0)


def free_bytes_needed(ckpt_bytes: int, kept: int, export_bytes: int = 0, existing: int = 0) -> int:
    """Free bytes needed: ``kept + 1`` checkpoints less ``existing`` ones, plus the export and a margin."""
    files = max(1, kept + 1 - existing)
    return ckpt_bytes * files + export_bytes + MARGIN_BYTES


def check_free_space(run_dir: Path, need: int) -> None:
    """One line if ``run_dir``'s file system has less than ``need`` bytes free."""
    free = shutil.disk_usage(run_dir).free
    if free < need:
        raise OSError(f"only {free / 2**20:.0f} MB free under {run_dir}; this model's checkpoints, their staging "
                      f"copy and the export need about {need / 2**20:.0f} MB (free space, keep fewer checkpoints "
                      "with callbacks.model_checkpoint.save_top_k=, or choose another hydra.run.dir=)")


@contextmanager
def staged_dir(dest: Path) -> Iterator[Path]:
    """A staging directory ``.<name>.partial-<pid>`` that replaces ``dest`` on success, removed on failure."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        replace_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


#: What a staged write killed mid-way leaves: ``[.]<name>.partial-<pid>``, ``.<name>.old-<pid>``.
STAGING_NAME = re.compile(r"\.(partial|old)-(\d+)$")


def remove_dead_partials(run_dir: Path) -> list[Path]:
    """Remove (and return) the staging files of dead writers in ``run_dir``, ``checkpoints/`` and ``monitor*/``."""
    removed = []
    dirs = [run_dir, run_dir / "checkpoints", *sorted(run_dir.glob("monitor*"))]
    for d in dirs:
        if not d.is_dir():
            continue
        for entry in d.iterdir():
            m = STAGING_NAME.search(entry.name)
            if m is None or int(m.group(2)) == os.getpid() or pid_alive(int(m.group(2))):
                continue
            original = d / entry.name[1 if entry.name.startswith(".") else 0:m.start()]
            if m.group(1) == "old" and not original.exists():
                os.replace(entry, original)  # killed between moving the previous export aside and renaming the new
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    if removed:
        log.info("removed %d staging file(s) of killed writers: %s", len(removed),
                                         ", ".join(p.name for p in removed))
    return removed

