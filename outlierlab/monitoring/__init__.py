"""Outlier monitors for any training loop (Kovaleva et al. 2021; Puccetti et al. 2022; Luo et al. 2021).

One concept per module:

- ``layernorm_tracker`` — ``LayerNormTracker``: LayerNorm gain/bias 3σ outliers and divergence from init.
- ``hidden_state_tracker`` — ``HiddenStateTracker``: activation outlier dims, anisotropy, kurtosis, ...
  on a fixed held-out batch tokenised by the model's own tokenizer; in the loop monitors also order use and
  attention locality (``outlierlab.metrics.word_order``).
- ``recording`` — what one record writes (history CSV, TensorBoard, figures), for every monitor alike.
- ``loop_monitor`` — ``OutlierMonitor``, ``monitor.step(model, step)`` in a hand-written loop.
- ``hf_trainer`` — ``OutlierMonitorCallback``, a ``transformers.TrainerCallback``.
- ``layernorm_monitor`` — ``LayerNormMonitor`` and ``hidden_state_monitor`` — ``HiddenStateMonitor``: the Lightning
  callbacks of train.py (``configs/callbacks/monitors.yaml``), adapters over the same trackers; when they record,
  resume handling and the trainer's loggers are ``lightning_monitor`` — ``LightningOutlierMonitor``.
- ``history`` — the append-only ``monitor/*.csv`` every monitor writes, and reading it back; ``monitor_plots`` —
  the monitors' figures.

Every loop's monitor goes through the same trackers and ``recording.publish``, so every loop writes the same
``monitor/*.csv`` rows.  Framework-free apart from ``hf_trainer`` (transformers) and the Lightning callbacks
(lightning); the classes load on first attribute access, so importing the package is cheap.
"""

import importlib

_LAZY = {
    "OutlierMonitor": "loop_monitor",
    "OutlierMonitorCallback": "hf_trainer",
    "LayerNormTracker": "layernorm_tracker",
    "HiddenStateTracker": "hidden_state_tracker",
    "publish": "recording",
    "LayerNormMonitor": "layernorm_monitor",
    "HiddenStateMonitor": "hidden_state_monitor",
    "LightningOutlierMonitor": "lightning_monitor",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
