"""Lightning callbacks that are not outlier monitors (those are ``outlierlab.monitoring``'s).

- ``progress_lines.ProgressLines`` — plain progress lines when stdout is not a terminal.
- ``interrupt_checkpoint.InterruptCheckpoint`` — ``last.ckpt`` on SIGTERM (schedulers, preemption).
- ``initial_checkpoint.InitialCheckpoint`` — the untrained weights as the step-0 checkpoint.

Kept free of heavy imports: the classes load on first attribute access.
"""

import importlib

_LAZY = {
    "ProgressLines": "progress_lines",
    "InterruptCheckpoint": "interrupt_checkpoint",
    "InitialCheckpoint": "initial_checkpoint",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
