"""Outlier monitors for any training loop (Kovaleva et al. 2021; Puccetti et al. 2022; Luo et al. 2021).

- ``layernorm_tracker`` — ``LayerNormTracker``: LayerNorm gain/bias 3σ outliers and divergence from init.
- ``hidden_state_tracker`` — ``HiddenStateTracker``: activation outlier dims, anisotropy, kurtosis, ... on a fixed
  held-out batch; in the loop monitors also order use and attention locality.
- ``recording`` — what one record writes (history CSV, TensorBoard, figures), for every monitor alike.
- ``loop_monitor`` — ``OutlierMonitor``; ``hf_trainer`` — ``OutlierMonitorCallback``, a ``TrainerCallback``.
- ``layernorm_monitor``, ``hidden_state_monitor`` — train.py's Lightning callbacks (base: ``lightning_monitor``).
- ``replay`` — the same trackers on every checkpoint of a finished run (``python -m outlierlab.jobs.posthoc``).
- ``history`` — the append-only ``monitor/*.csv`` and reading it back; ``monitor_plots`` — the figures.

Every monitor goes through the same trackers and ``recording.publish``, so every loop writes the same rows.
"""
