"""The pretraining job behind ``python train.py``: config -> datamodule -> module -> Trainer -> export.

Kept out of ``train.py`` so the entry point stays thin and its heavy imports happen only after
the config has been validated.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE  # Lightning's own choice of bar
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from outlierlab.metrics.word_order import ORDER_USE_THRESHOLD, cannot_use_order, order_use_message
from outlierlab.datamodules.budget import DataBudget, data_budget
from outlierlab.jobs.model_card import record_trained_steps, write_model_card
from outlierlab.models import EncoderConfig, hf_exportable, save_pretrained
from outlierlab.lightning_modules.callbacks.progress_lines import StepRichProgressBar
from outlierlab.lightning_modules.mlm_module import MLMLitModule
from outlierlab.jobs.checkpoint_io import (StagedCheckpointIO, check_free_space, checkpoint_bytes, checkpoints_kept,
                                           free_bytes_needed, remove_dead_partials, staged_dir)
from outlierlab.configuration.overrides import unwritable_run_dir
from outlierlab.jobs.run_errors import disk_full_error, error_line
from outlierlab.utils.dir_lock import lock_run_dir
from outlierlab.jobs.run_resume import (ConfigInCheckpoint, config_changes, resume_point, set_aside_end_state,
                                        set_aside_later_timeline)
from outlierlab.jobs.run_state import (CODE_VERSIONS, FAILED_MARKER, changes_text, mark_failed, mark_finished,
                                       record_start, release_room, reserve_room, skip_finished)
from outlierlab.lightning_modules.loggers import one_console_for_lightning
from outlierlab.utils.atomic import write_atomic
from outlierlab.utils.dir_lock import is_primary_process

log = logging.getLogger(__name__)
#: The exit status of a run stopped by SIGTERM (128 + 15): Lightning's own exits 0, and ``train.py && evaluate.py``
#: would go on with an unfinished run.
SIGTERM_EXIT = 143


def ensure_writable(run_dir: Path) -> None:
    """Fail at start, not after an hour, if the run directory cannot be written."""
    error = unwritable_run_dir(run_dir)
    if error:
        raise OSError(error)


def ensure_room(run_dir: Path, module: L.LightningModule, cfg: DictConfig) -> int:
    """Refuse to start unless the run directory can hold the checkpoints and export; return the bytes."""
    ckpt = checkpoint_bytes(module)
    existing = len(list((run_dir / "checkpoints").glob("*.ckpt")))
    export = ckpt // 3 if cfg.get("export", True) else 0
    need = free_bytes_needed(ckpt, checkpoints_kept(cfg), export, existing)
    check_free_space(run_dir, need)
    return need


def report_data_budget(datamodule, trainer: L.Trainer, warn_above: float | None) -> DataBudget:
    """Log the run's data budget; warn above ``warn_above`` epochs (a memorisation regime)."""
    budget = data_budget(int(datamodule.stats["train_blocks"]), int(datamodule.stats["train_tokens"]),
                         datamodule.batch_size, trainer.world_size, trainer.accumulate_grad_batches,
                         trainer.max_steps, trainer.max_epochs)
    if trainer.global_rank == 0:
        log.info(budget.summary())
        if warn_above is not None and budget.epochs > warn_above:
            log.warning("this run loops %.0f times over its training data (> data_epochs_warning=%s): a "
                        "memorisation regime, not the paper's few epochs; use more text (data.max_documents=null, "
                        "data=english_large) or fewer steps", budget.epochs, warn_above)
    return budget


def report_order_use(metrics: dict[str, float], threshold: float | None, config: EncoderConfig | None = None
                     ) -> str | None:
    """Log one line when the run ends below ``threshold`` nats of order use (a bag-of-words model's loss)."""
    value = metrics.get("val/order_use")
    if value is None or threshold is None:
        return None
    orderless = config is not None and cannot_use_order(config.pos.get("name"), config.causal)
    line = order_use_message(value, float(threshold), orderless)
    if line is not None:
        log.warning(line)
    return line


def _export_dir(run_dir: Path, config: EncoderConfig) -> Path:
    return run_dir / ("hf" if hf_exportable(config) else "model")


def _relaunch_args_for_ddp_children(run_dir: Path) -> None:
    """Record this job's overrides for DDP ranks >= 1 (lightning-hydra-template #393)."""
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not running under @hydra.main (tests calling train() directly)
        return
    os.environ["OUTLIERLAB_CHILD_ARGV"] = json.dumps(
        # quoted: a sweep cell's directory holds '=' and ','
        [o for o in overrides if not o.startswith("hydra.")] + [f'hydra.run.dir="{run_dir}"', "hydra.output_subdir=null"]
    )


_DDP_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


def _release_ddp(env_before: dict[str, str | None]) -> None:
    """Undo what Lightning's DDP launcher left in this process, for the next job of a multirun."""
    if env_before.get("LOCAL_RANK") is not None:
        return  # ranks launched from outside (torchrun, SLURM, or a child of ours): leave them be
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for key, value in env_before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _mark_finished(run_dir: Path, trainer: L.Trainer, metrics: dict[str, float],
                   config: dict[str, Any] | None = None) -> dict[str, float]:
    """``run_state.mark_finished`` with the optimizer's class, device kind and determinism."""
    how = {"accelerator": type(trainer.accelerator).__name__.removesuffix("Accelerator").lower(),
           "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
           # the optimizer that trained it (its settings are in config.yaml and the card): a study's arms, at a glance
           "optimizer": type(trainer.optimizers[0]).__name__ if trainer.optimizers else None}
    return mark_finished(run_dir, int(trainer.global_step), int(trainer.max_steps), metrics, config, how)


def parallel_cells() -> int:
    """How many sweep cells run at once: joblib's ``n_jobs`` (-1: one per core), else 1."""
    try:
        launcher = HydraConfig.get().launcher
    except ValueError:  # not under @hydra.main
        return 1
    if "joblib" not in str(launcher.get("_target_", "")).lower():
        return 1
    n = int(launcher.get("n_jobs") or 1)
    return (os.cpu_count() or 1) if n < 0 else n


def set_threads(threads: int | None) -> int:
    """Intra-op threads: ``threads``, else ``$OMP_NUM_THREADS``, else the cores shared among parallel cells."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    n = (int(threads) if threads else int(given) if given.isdigit() and int(given) > 0
         else max(1, (os.cpu_count() or 1) // parallel_cells()))
    torch.set_num_threads(n)
    return n


def train(cfg: DictConfig) -> dict[str, float]:
    """Run pretraining as configured (run directory locked, finished runs skipped); return the metrics."""
    one_console_for_lightning()
    run_dir = Path(cfg.run_dir).resolve()
    primary = is_primary_process()  # DDP ranks >= 1 share rank 0's lock and write no markers
    if primary:
        ensure_writable(run_dir)
    lock = lock_run_dir(run_dir) if primary else None
    try:
        if primary:  # under the lock no other writer is alive here: staging files of a killed run are litter
            remove_dead_partials(run_dir)
            reserve_room(run_dir)  # room for failed.json on a disk that fills up during the run
        skipped = skip_finished(cfg)  # asked again under the lock: another process may have finished it since
        if skipped is not None:
            return skipped
        env_before = {k: os.environ.get(k) for k in _DDP_ENV}
        progress: dict[str, Any] = {}
        try:
            return _train(cfg, progress)
        except SIGTERMException:
            trainer = progress.get("trainer")
            step = int(trainer.global_step) if trainer is not None else "?"
            log.warning("stopped by a signal at step %s: last.ckpt holds that step; the same command resumes it "
                        "(exit status %d: the run is not finished)", step, SIGTERM_EXIT)
            raise SystemExit(SIGTERM_EXIT) from None
        except Exception as e:
            if primary:
                trainer = progress.get("trainer")
                if disk_full_error(e) is not None:
                    release_room(run_dir)  # the reserve makes room for failed.json on a disk with no byte left
                try:
                    mark_failed(run_dir, error_line(e, run_dir), int(trainer.global_step) if trainer is not None else None)
                    e.failed_recorded = True  # run_errors.run_main: failed.json is written, with the step
                except OSError:  # a full or vanished disk: the original error is the one to report
                    pass
            raise
        finally:
            _release_ddp(env_before)
    finally:
        if lock is not None:
            lock.release()


def _train(cfg: DictConfig, progress: dict[str, Any]) -> dict[str, float]:
    run_dir = Path(cfg.run_dir).resolve()
    threads = set_threads(cfg.get("threads"))
    L.seed_everything(cfg.seed, workers=True)

    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    tokenizer = datamodule.tokenizer

    config: EncoderConfig = hydra.utils.instantiate(
        cfg.model,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id,
        eos_token_id=tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id,
    )
    if datamodule.block_size > config.max_len:
        raise ValueError(
            f"data.block_size={datamodule.block_size} is larger than the model's max_len={config.max_len}; "
            f"lower data.block_size or raise model.max_len"
        )
    ckpt_path, start_step, trained_config = resume_point(cfg, run_dir, config)
    module: MLMLitModule = hydra.utils.instantiate(cfg.module, model=config)
    # one training block, on which Lightning's model summary counts FLOPs (token ids do not change the count)
    module.example_input_array = {"input_ids": torch.zeros(1, datamodule.block_size, dtype=torch.long)}
    ensure_room(run_dir, module, cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    trainer = _make_trainer(cfg, ConfigInCheckpoint(resolved))
    progress["trainer"] = trainer

    report_data_budget(datamodule, trainer, cfg.get("data_epochs_warning"))
    log.info("%d intra-op thread(s) for this run", threads)
    if trainer.global_rank == 0:
        changes = {} if ckpt_path is None else config_changes(trained_config or run_dir / "config.yaml", resolved)
        # code_versions.jsonl records a resume on other code or settings (config.yaml states only this start's)
        start = record_start(run_dir, start_step, config_changes=changes)
        if changes:
            log.warning("resuming with %d setting(s) other than its checkpoint trained with (recorded in %s): %s",
                        len(changes), CODE_VERSIONS, changes_text(start))
        (run_dir / FAILED_MARKER).unlink(missing_ok=True)  # it tells how the last attempt ended; this one has not
        if ckpt_path is not None and not 0 < trainer.max_steps <= start_step:  # training past the last end (also
            # from a step-0 checkpoint): its export and finished.json go aside (run_resume.set_aside_end_state)
            for line in set_aside_end_state(run_dir, start_step):
                log.info(line)
        if cfg.get("ckpt_path") not in (None, "", "null", "last"):  # a checkpoint named: maybe a roll-back
            for line in set_aside_later_timeline(run_dir, start_step):
                log.warning(line)
        # whole or not at all: the card, post-hoc monitors and export must never read a torn config
        write_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(resolved))
        # self-contained from the start: post-hoc analysis and probe.py find the tokenizer even without an export
        tokenizer.save_pretrained(str(run_dir / "tokenizer"))
    _relaunch_args_for_ddp_children(run_dir)
    # MLMLitModule.on_before_batch_transfer does not replace a datamodule hook; Lightning warns anyway
    warnings.filterwarnings("ignore", message=r".*overridden `on_before_batch_transfer` in `LightningModule`")
    # Lightning 2.6's own pytree helper calls an API torch 2.13 deprecates: printed at every start, nothing to act on
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)

    return _finish(cfg, run_dir, trainer, module, config, tokenizer)


def _make_trainer(cfg: DictConfig, *own: L.Callback) -> L.Trainer:
    """The Lightning Trainer with the configured callbacks, the run's own, loggers and checkpoint IO."""
    callbacks = [hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    callbacks += own
    loggers = [hydra.utils.instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    # checkpoints staged beside their destination (Lightning #21253): no torn file under a checkpoint's name
    plugins = list(hydra.utils.instantiate(cfg.trainer.get("plugins")) or [])
    if not any(isinstance(p, CheckpointIO) for p in plugins):  # a CheckpointIO of the user's own wins
        plugins.append(StagedCheckpointIO())
    trainer_cfg = {k: v for k, v in cfg.trainer.items() if k != "plugins"}
    if trainer_cfg.get("enable_progress_bar", True) and _RICH_AVAILABLE \
            and not any(isinstance(c, ProgressBar) for c in callbacks):  # the bar Lightning would add, reading
        callbacks.append(StepRichProgressBar())  # "Epoch 0" rather than "Epoch 0/-2" under max_epochs=-1
    if trainer_cfg.get("enable_checkpointing") is None and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
        # else Lightning adds its own ModelCheckpoint, which the disk check does not count
        trainer_cfg["enable_checkpointing"] = False
    trainer: L.Trainer = hydra.utils.instantiate(trainer_cfg, callbacks=callbacks, logger=loggers or False,
                                                 plugins=plugins)
    return trainer


def _finish(cfg: DictConfig, run_dir: Path, trainer: L.Trainer, module, config: EncoderConfig,
            tokenizer) -> dict[str, float]:
    """After ``trainer.fit``: export, model card, order-use line, post-hoc analyses, ``finished.json``."""
    if cfg.get("export", True) and trainer.global_rank == 0:
        out = _export_dir(run_dir, config)
        tokenizer.model_max_length = config.max_len  # so HF tools truncate to what the model accepts
        with staged_dir(out) as staging:  # written beside hf/ (model/), renamed into place when complete
            # remote_code: model/ also loads with transformers alone; the card once csv/metrics.csv has validation
            fmt = save_pretrained(module.model, staging, tokenizer=tokenizer, remote_code=True)
            record_trained_steps(staging, trainer.global_step)  # export_run's card of a run stopped early reads it
            write_model_card(run_dir, staging, global_step=trainer.global_step)
        log.info("exported the trained model (%s format) and tokenizer to %s", fmt, out)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    if trainer.global_rank == 0:
        report_order_use(metrics, cfg.get("order_use_threshold", ORDER_USE_THRESHOLD), config)
    if trainer.global_rank == 0 and trainer.global_step >= trainer.max_steps > 0:
        if cfg.get("posthoc", False):
            from outlierlab.monitoring.replay import analyze_run  # every checkpoint, the monitors' statistics

            res = analyze_run(run_dir)
            log.info("post-hoc analysis of steps %s -> %s", res["steps"], res["metrics"])
        if cfg.get("posthoc_probe"):  # position probe + similarity by distance on every step checkpoint
            from outlierlab.jobs.checkpoint_probes import probe_run

            probe_run(run_dir, list(cfg.posthoc_probe.get("overrides") or []), int(cfg.posthoc_probe.max_sentences))
        # last: a cell counts as done only with all its files; a re-entered finished run keeps its marker's metrics
        metrics = _mark_finished(run_dir, trainer, metrics, OmegaConf.to_container(cfg, resolve=True))
    if trainer.global_rank == 0:  # the last line says where the run went and what to run on it next
        print(closing_line(run_dir, trainer.global_step, metrics), flush=True)
    return metrics


def closing_line(run_dir: str | os.PathLike, step: int, metrics: dict[str, float]) -> str:
    """train.py's last line: the step, the last validation loss, the run directory, what reads it."""
    loss = metrics.get("val/loss")
    return (f"[train] done at step {step}" + (f", val/loss {loss:.4f}" if loss is not None else "")
            + f": run directory {run_dir} (tensorboard --logdir {run_dir}; python probe.py "
              f"encoder.name_or_path={run_dir})")
