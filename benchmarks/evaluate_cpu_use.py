#!/usr/bin/env python
"""How many cores the bare forward and the sentence analyses keep busy: CPU time over wall time of each, in one
process (``resource.getrusage``).  Whether overlapping evaluate's statistics with the model's forward (a worker
thread) could win anything: only where a core sits idle.

    python benchmarks/evaluate_cpu_use.py            # MiniLM, the 2,000 default sentences, torch's default threads

OpenMP's spin-waits count as busy time, so a figure near the thread count bounds, rather than measures, the idle
time an overlap could use.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SENTENCE_ANALYSES = "analyses=[outliers,anisotropy,isotropy,self_similarity]"


def busy(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of ``fn()``."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main() -> None:
    import torch
    from evaluate_vs_forward import bare_forward, compose, run_evaluate

    from outlierlab.datamodules.probe_data import load_position_texts

    cfg = compose([])
    texts, batch = load_position_texts(None, 2000), int(cfg.encoder.batch_size)
    bare_forward(cfg.encoder, texts[:64], batch)  # warm-up
    for name, fn in [("bare forward", lambda: bare_forward(cfg.encoder, texts, batch)),
                     ("sentence analyses (model load included)", lambda: run_evaluate([SENTENCE_ANALYSES]))]:
        wall, cpu = busy(fn)
        print(f"{name}: wall {wall:.1f} s, CPU {cpu:.1f} s = {cpu / wall:.2f} cores busy "
              f"({torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
