"""Save ``last.ckpt`` when a scheduler or a person stops training with SIGTERM, or training stops early by itself
(``trainer.max_time``, early stopping), so a resumed run loses at most the step in flight.

Lightning raises ``SIGTERMException`` at the end of the batch (a consistent state).  Unlike Lightning's
``OnExceptionCheckpoint``, which saves on *any* exception (a non-finite loss, a bug) a resume must not trust, this saves
only for SIGTERM, staged and renamed.  Under submitit an installed ``SIGUSR2`` handler (which requeues mid-step) is
deferred while training runs: Lightning stops after the step, ``last.ckpt`` is written, then the handler runs.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, Callable

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)


class InterruptCheckpoint(Callback):
    """On SIGTERM or a stop short of ``max_steps``: write ``<dirpath>/<filename>.ckpt`` after the step."""

    #: Signals whose existing handler (a scheduler's requeue) runs only after the checkpoint is written.
    DEFERRED_SIGNALS = ("SIGUSR2",)
    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        self.dirpath, self.filename = os.path.expanduser(str(dirpath)), filename
        self._deferring = False
        self._pending: tuple[Callable, int, Any] | None = None

    @property
    def ckpt_path(self) -> str:
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._deferring = True
        if threading.current_thread() is not threading.main_thread():
            return  # handlers can only be installed from the main thread
        for name in self.DEFERRED_SIGNALS:
            sig = getattr(signal, name, None)
            old = signal.getsignal(sig) if sig is not None else None
            if callable(old) and not getattr(old, "_outlierlab_deferred", False):

                def deferred(signum, frame, _old=old, _trainer=trainer):
                    if not self._deferring:  # training is over: behave exactly as the original handler
                        return _old(signum, frame)
                    log.warning("%s: stopping at the end of this step to save %s first",
                                signal.Signals(signum).name, self.ckpt_path)
                    self._pending = (_old, signum, frame)
                    _trainer._signal_connector.received_sigterm = True  # Lightning's own orderly stop

                # Lightning snapshots every handler after on_fit_start and restores that snapshot at its
                # teardown, so this wrapper may outlive training: it then passes the signal straight on.
                deferred._outlierlab_deferred = True
                signal.signal(sig, deferred)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._deferring = False

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # stopped short of max_steps (max_time, early stopping): the periodic checkpoint may be steps older
        if 0 < trainer.max_steps and trainer.global_step < trainer.max_steps:
            self._save(trainer, "stopped before trainer.max_steps")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._deferring = False
        if not isinstance(exception, SIGTERMException):
            return
        self._save(trainer, "stopped by a signal")
        if self._pending is not None:
            handler, signum, frame = self._pending
            self._pending = None
            handler(signum, frame)  # e.g. submitit: requeue this cell, then exit

    def _save(self, trainer: L.Trainer, why: str) -> None:
        """``last.ckpt`` at the current step, written under a temporary name and renamed (never torn)."""
        os.makedirs(self.dirpath, exist_ok=True)
        tmp = os.path.join(self.dirpath, f".{self.filename}.interrupted{self.FILE_EXTENSION}")
        trainer.save_checkpoint(tmp)
        if trainer.is_global_zero:
            os.replace(tmp, self.ckpt_path)
            log.warning("%s at global step %d: saved %s; run again in the same directory to resume", why,
                        trainer.global_step, self.ckpt_path)
