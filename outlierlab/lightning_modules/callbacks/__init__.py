"""Training-time outlier monitors (Lightning callbacks) and their CSV history.

- ``layernorm_monitor.LayerNormMonitor`` — LayerNorm gain/bias 3σ outliers and divergence from init
  (Kovaleva et al. 2021; Puccetti et al. 2022).
- ``hidden_state_monitor.HiddenStateMonitor`` — activation outlier dims and anisotropy on a fixed
  held-out batch (Luo et al. 2021; Ethayarajh 2019).
- both are adapters over the framework-free trackers of ``outlierlab.monitoring``, which the plain-loop
  ``OutlierMonitor`` and the Hugging Face ``OutlierMonitorCallback`` drive too.
- ``progress.ProgressLines`` — plain progress lines when stdout is not a terminal.
- ``interrupt_checkpoint.InterruptCheckpoint`` — ``last.ckpt`` on SIGTERM (schedulers, preemption).

Kept free of heavy imports: the classes load on first attribute access.
"""

import importlib

_LAZY = {
    "LayerNormMonitor": "layernorm_monitor",
    "HiddenStateMonitor": "hidden_state_monitor",
    "LightningOutlierMonitor": "base",
    "OutlierMonitor": "base",  # the old name of LightningOutlierMonitor
    "ProgressLines": "progress",
    "InterruptCheckpoint": "interrupt_checkpoint",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
