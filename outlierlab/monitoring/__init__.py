"""Outlier monitors for any training loop (Kovaleva et al. 2021; Puccetti et al. 2022; Luo et al. 2021).

One concept per module:

- ``layernorm_tracker`` — ``LayerNormTracker``: LayerNorm gain/bias 3σ outliers and divergence from init.
- ``hidden_state_tracker`` — ``HiddenStateTracker``: activation outlier dims, anisotropy, kurtosis, ...
  on a fixed held-out batch tokenised by the model's own tokenizer; in the loop monitors also order use and
  attention locality (``outlierlab.analysis.order_use``).
- ``recording`` — what one record writes (history CSV, TensorBoard, figures), for every monitor alike.
- ``loop_monitor`` — ``OutlierMonitor``, ``monitor.step(model, step)`` in a hand-written loop.
- ``hf_trainer`` — ``OutlierMonitorCallback``, a ``transformers.TrainerCallback``.

The Lightning callbacks (``outlierlab.lightning_modules.callbacks``) are adapters over the same trackers and
``recording.publish``, so every loop writes the same ``monitor/*.csv`` rows.  Framework-free apart from
``hf_trainer`` (transformers); the classes load on first attribute access, so importing the package is cheap.
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
