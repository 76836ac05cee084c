"""What a resume does to a run directory: which checkpoint it starts from (``resume_point``), what its last end or an
abandoned timeline wrote is set aside, settings its checkpoint would override are refused, and every other setting it
changes is recorded (``config_changes``) against those its checkpoint trained with (docs/run_directories.md).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf

from outlierlab.jobs.run_state import FINISHED_MARKER, MANIFEST, read_yaml
from outlierlab.models import EncoderConfig
from outlierlab.models.checkpoint import read_checkpoint

log = logging.getLogger(__name__)

#: The key under which a checkpoint holds the resolved config of the start that wrote it (:class:`ConfigInCheckpoint`).
TRAINED_CONFIG = "outlierlab_config"

#: The export folders train.py writes at a run's end (``hf/``: a plain RoBERTa; ``model/``: everything else).
END_EXPORTS = ("hf", "model")


def _readable(path: Path) -> dict[str, Any] | None:
    try:
        # mmap: a truncated zip archive fails at once, and large checkpoints are not read twice.
        return read_checkpoint(path, mmap=True)
    except ValueError:  # any unreadable file is "not a good checkpoint"
        return None


def resolve_checkpoint(ckpt_path: str | None, run_dir: Path) -> tuple[str | None, dict[str, Any] | None]:
    """``ckpt_path`` as a readable checkpoint; ``last``: the readable one holding the highest step."""
    if ckpt_path in (None, "", "null"):
        return None, None
    if ckpt_path == "last":
        ckpt_dir = run_dir / "checkpoints"
        candidates = sorted(ckpt_dir.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
        if not candidates:
            raise FileNotFoundError(
                f"ckpt_path=last but {ckpt_dir} holds no checkpoint; start without ckpt_path, or pass "
                "hydra.run.dir= of the run to resume"
            )
        # by step, not name: a kill during last.ckpt's rewrite leaves it behind a newer step checkpoint
        best: tuple[Path, dict[str, Any], int] | None = None
        unreadable = []
        for cand in candidates:
            ckpt = _readable(cand)
            if ckpt is None:
                unreadable.append(cand.name)
                continue
            step = int(ckpt.get("global_step", 0))
            if best is None or step > best[2] or (step == best[2] and cand.name == "last.ckpt"):
                best = (cand, ckpt, step)
        if best is None:
            raise ValueError(f"no readable checkpoint in {ckpt_dir} (all {len(candidates)} are corrupt or truncated)")
        last = ckpt_dir / "last.ckpt"
        if best[0] != last:
            log.warning("resuming from %s (step %d), the newest readable checkpoint%s%s", best[0].name, best[2],
                        f"; unreadable: {', '.join(unreadable)}" if unreadable else "",
                        "; last.ckpt holds an older step" if last.exists() and last.name not in unreadable else "")
        return str(best[0]), best[1]
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path {path} does not exist")
    ckpt = _readable(path)
    if ckpt is None:
        raise ValueError(f"checkpoint {path} is unreadable (truncated or not a Lightning checkpoint)")
    return str(path), ckpt


def check_checkpoint_matches(ckpt: dict[str, Any], config: EncoderConfig, path: str) -> None:
    """One line naming the fields that differ between a checkpoint's model and the current config."""
    saved = (ckpt.get("hyper_parameters") or {}).get("model")
    if saved is None:
        raise ValueError(f"checkpoint {path} was not written by train.py (no model hyper-parameters)")
    current = config.to_dict()
    saved = EncoderConfig.from_dict(saved).to_dict()  # keys added to the config since: their defaults
    diff = [f"{k}: {saved.get(k)!r} in checkpoint vs {current[k]!r} now" for k in current if saved.get(k) != current[k]]
    if diff:
        raise ValueError(f"checkpoint {path} belongs to a different model config ({'; '.join(diff)})")


class ConfigInCheckpoint(L.Callback):
    """The start's resolved config in every checkpoint: what a resume's ``config_changes`` compare against."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[TRAINED_CONFIG] = self.config


def resume_point(cfg: DictConfig, run_dir: Path, config: EncoderConfig
                 ) -> tuple[str | None, int, dict[str, Any] | None]:
    """``(ckpt_path, step, trained config)``: the requested or an unfinished run's last checkpoint, checked."""
    requested = cfg.get("ckpt_path")
    if requested in (None, "", "null") and any((run_dir / "checkpoints").glob("*.ckpt")):
        if not cfg.get("resume", True):
            # a fresh run there would mix its checkpoints and logs with the old run's
            raise ValueError(f"resume=false, but {run_dir / 'checkpoints'} holds the checkpoints of an earlier run: "
                             f"give this run another run_dir, or delete {run_dir} first to start over there")
        # an interrupted cell of a sweep (or a re-run into the same hydra.run.dir): continue it
        log.info("%s holds checkpoints of an unfinished run: resuming from the last one (resume=false refuses)",
                 run_dir)
        requested = "last"
    ckpt_path, ckpt = resolve_checkpoint(requested, run_dir)
    start_step, trained_config = 0, None
    if ckpt is not None:
        check_checkpoint_matches(ckpt, config, ckpt_path)
        optimizer = OmegaConf.select(cfg, "optimizer")
        ignored = optimizer_settings_ignored(ckpt, OmegaConf.to_container(optimizer, resolve=True)
                                             if isinstance(optimizer, DictConfig) else None)
        if ignored:
            raise ValueError(f"checkpoint {ckpt_path} trained with other optimizer settings: {'; '.join(ignored)}; a "
                             "resume restores its optimizer state, so they would not take effect while config.yaml "
                             "stated them: drop the override(s), or train a new run in another run_dir")
        start_step = int(ckpt.get("global_step", 0))
        trained_config = ckpt.get(TRAINED_CONFIG) if isinstance(ckpt.get(TRAINED_CONFIG), dict) else None
        del ckpt
        max_steps = OmegaConf.select(cfg, "trainer.max_steps")
        if isinstance(max_steps, int) and 0 < max_steps < start_step:  # it would finish "at max_steps" holding more
            raise ValueError(f"checkpoint {ckpt_path} holds step {start_step}, past trainer.max_steps={max_steps}: a "
                             f"resume cannot shorten a run; give trainer.max_steps>={start_step}, or train "
                             f"{max_steps} steps in another run_dir")
    return ckpt_path, start_step, trained_config


def set_aside_end_state(run_dir: Path, resumed_from: int) -> list[str]:
    """A run about to train past ``resumed_from``: what its last end wrote stops describing it.  ``finished.json``
    and ``manifest.json`` are removed; an export (``hf/``, ``model/``) of exactly the resumed step of an unfinished
    run is removed (a copy of the checkpoint; one per call would pile up), any other is renamed
    ``<name>.before-resume-at-step<N>``.  Returns one line per export.  Each step is one rename or unlink, so a kill
    leaves an export whole or under a hidden name."""
    from outlierlab.jobs.model_card import trained_steps  # lazy: the card's module reads the run's files

    run_dir, step = Path(run_dir), int(resumed_from)
    finished = (run_dir / FINISHED_MARKER).exists()
    (run_dir / FINISHED_MARKER).unlink(missing_ok=True)
    (run_dir / MANIFEST).unlink(missing_ok=True)
    lines = []
    for sub in END_EXPORTS:
        for leftover in run_dir.glob(f".{sub}.removing*"):  # a removal a kill interrupted
            shutil.rmtree(leftover, ignore_errors=True)
        export = run_dir / sub
        if not export.is_dir():
            continue
        if not finished and trained_steps(export) == step:
            doomed = _unused(run_dir / f".{sub}.removing")
            os.replace(export, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            lines.append(f"{sub}/ held step {step} of a run stopped early, the checkpoint this resume starts from: "
                         "removed (the run's end exports anew)")
            continue
        target = _unused(run_dir / f"{sub}.before-resume-at-step{step}")
        os.replace(export, target)
        lines.append(f"{sub}/ holds the model of the run's previous end: moved to {target.name}/ (training resumes "
                     f"from step {step}; the run's end exports anew)")
    return lines


def _unused(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... where it is taken (resumed from the same step twice: keep both)."""
    target, n = path, 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}-{n}")
    return target


def set_aside_later_timeline(run_dir: Path, resumed_from: int) -> list[str]:
    """A roll-back: checkpoints and probe outputs past ``resumed_from`` move to ``abandoned-after-step<N>/``,
    ``monitor_posthoc/`` aside, so ``ckpt_path=last`` continues the new timeline; one line per folder moved."""
    from outlierlab.models.checkpoint import read_checkpoint  # lazy: torch only where a run resumes

    run_dir, n = Path(run_dir), int(resumed_from)
    later = []
    for ckpt in sorted((run_dir / "checkpoints").glob("*.ckpt")):
        try:
            step = int(read_checkpoint(ckpt, mmap=True).get("global_step", -1))
        except ValueError:  # unreadable: not a state anyone resumes from
            continue
        if step > n:
            later.append(ckpt)
    if not later:
        return []
    lines = []
    aside = _unused(run_dir / "checkpoints" / f"abandoned-after-step{n}")
    aside.mkdir()
    for ckpt in later:
        os.replace(ckpt, aside / ckpt.name)
    lines.append(f"{len(later)} checkpoint(s) past step {n} hold the abandoned timeline: moved to "
                 f"checkpoints/{aside.name}/ ({', '.join(c.name for c in later)})")
    probes = run_dir / "probe_posthoc"
    probed = {d: int(d.name[4:]) for d in probes.glob("step*") if d.is_dir() and d.name[4:].isdigit()}
    if any(step > n for step in probed.values()):
        from outlierlab.jobs.checkpoint_probes import gather  # lazy: the probe job's table names

        to = _unused(probes / f"abandoned-after-step{n}")
        to.mkdir()
        for d, step in probed.items():
            if step > n:
                os.replace(d, to / d.name)
        gather(probes, sorted(step for step in probed.values() if step <= n))
        lines.append(f"probe outputs past step {n} moved to probe_posthoc/{to.name}/")
    if (run_dir / "monitor_posthoc").is_dir():
        to = _unused(run_dir / f"monitor_posthoc.before-resume-at-step{n}")
        os.replace(run_dir / "monitor_posthoc", to)
        lines.append(f"monitor_posthoc/ moved to {to.name}/ (the run's end recomputes it)")
    return lines


def optimizer_settings_ignored(ckpt: dict[str, Any], optimizer: dict[str, Any] | None) -> list[str]:
    """``optimizer.<key>=<asked> (the checkpoint's: <value>)`` per setting ``ckpt`` did not train with: a resume
    restores the optimizer state, so it would not take effect (first group of each part; ``initial_lr``)."""
    states = ckpt.get("optimizer_states") or []
    groups = states[0].get("param_groups") if states and isinstance(states[0], dict) else None
    if not optimizer or not groups:
        return []
    # a split optimizer (Muon on the matrices, AdamW on the rest) has one first group per part; a setting is held
    # when one of them holds it (``eps`` is AdamW's in the config, Muon's own is another)
    firsts, start = [], 0
    for n in states[0].get("split") or [len(groups)]:
        firsts.append(groups[start])
        start += n
    out = []
    for key, asked in optimizer.items():
        if str(key).startswith("_"):  # _target_, _partial_: Hydra's, not the optimizer's
            continue
        held = [g.get("initial_lr", g.get("lr")) if key == "lr" else g.get(key) for g in firsts]
        held = [h for h in held if h is not None]
        if held and not any(_same_setting(asked, h) for h in held):
            out.append(f"optimizer.{key}={asked} (the checkpoint's: {held[0] if len(held) == 1 else held})")
    return out


def _same_setting(a: Any, b: Any) -> bool:
    """Equal as settings: sequences element-wise (a YAML list, a checkpoint's tuple), numbers to 1e-9."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_setting(x, y) for x, y in zip(a, b))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def dotted_keys(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config (plain dicts) as ``{"trainer.max_steps": 300, ...}``: lists are values, not levels."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(dotted_keys(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


#: Settings of how a run is launched, resumed or shown, not of what it trains: the keys a cell's name leaves out.
RUN_CONTROLS = ("study", "ckpt_path", "resume", "skip_finished", "threads", "paths", "posthoc", "posthoc_probe",
                "trainer.enable_progress_bar", "callbacks.progress.when")


def config_changes(before: dict[str, Any] | Path, config: dict[str, Any]) -> dict[str, list[Any]]:
    """``{key: [before, now]}`` for every setting of ``config`` that differs from ``before`` (the trained config, or
    a ``config.yaml`` path; {} when unreadable), ``RUN_CONTROLS`` aside.  Recorded, not refused: a resume may rightly
    change ``trainer.max_steps``; whether a changed ``data.files`` matters is the user's to judge."""
    if not isinstance(before, dict):
        before = read_yaml(before)
    if not isinstance(before, dict):
        return {}
    old, new = dotted_keys(before), dotted_keys(config)
    return {k: [old.get(k), new.get(k)] for k in sorted(old.keys() | new.keys())
            if not any(k == c or k.startswith(c + ".") for c in RUN_CONTROLS)
            and not _same_setting(old.get(k), new.get(k))}
