"""Lightning callbacks that are not outlier monitors (those are ``outlierlab.monitoring``'s).

- ``progress_lines.ProgressLines`` — plain progress lines when stdout is not a terminal.
- ``interrupt_checkpoint.InterruptCheckpoint`` — ``last.ckpt`` on SIGTERM (schedulers, preemption).
- ``initial_checkpoint.InitialCheckpoint`` — the untrained weights as the step-0 checkpoint.
"""
