"""Outlier monitors for any training loop (Kovaleva et al. 2021; Puccetti et al. 2022; Luo et al. 2021).

One concept per module:

- :mod:`.layernorm_tracker` — :class:`LayerNormTracker`: LayerNorm gain/bias 3σ outliers and divergence from init.
- :mod:`.hidden_state_tracker` — :class:`HiddenStateTracker`: activation outlier dims, anisotropy, kurtosis, ...
  on a fixed held-out batch tokenised by the model's own tokenizer; in the loop monitors also order use and
  attention locality (:mod:`outlierlab.analysis.order_use`).
- :mod:`.recording` — what one record writes (history CSV, TensorBoard, figures), for every monitor alike.
- :mod:`.loop_monitor` — :class:`OutlierMonitor`, ``monitor.step(model, step)`` in a hand-written loop.
- :mod:`.hf_trainer` — :class:`OutlierMonitorCallback`, a ``transformers.TrainerCallback``.

The Lightning callbacks (:mod:`outlierlab.lightning_modules.callbacks`) are adapters over the same trackers and
:func:`.recording.publish`, so every loop writes the same ``monitor/*.csv`` rows.  Framework-free apart from
:mod:`.hf_trainer` (transformers); the classes load on first attribute access, so importing the package is cheap.
"""

import importlib

_LAZY = {
    "OutlierMonitor": "loop_monitor",
    "OutlierMonitorCallback": "hf_trainer",
    "LayerNormTracker": "layernorm_tracker",
    "HiddenStateTracker": "hidden_state_tracker",
    "publish": "recording",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
