#!/usr/bin/env python
"""Seconds to draw the monitors' figures, as every image record of a training run draws them.

    python benchmarks/monitor_figure_cost.py                       # 5 layers, 20 records, 9 LayerNorms x 256 dims
    python benchmarks/monitor_figure_cost.py --layers 13 --dim 768 --records 100

Synthetic histories of the default shapes (``outlierlab.monitoring.monitor_plots``): the metric curves (every
statistic of :data:`~outlierlab.monitoring.monitor_plots.CURVE_STATISTICS`, one line per layer), a LayerNorm-gain
heatmap and the mean-vector figure, each built and drawn on the Agg canvas (:func:`render`); the median of
``--repeat`` draws each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from statistics import median

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=5, help="hidden-state layers (embeddings + blocks)")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--records", type=int, default=20, help="recorded steps in the history")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from outlierlab.monitoring import monitor_plots as plots

    rng = np.random.default_rng(0)
    steps = list(range(0, 50 * a.records, 50))
    curves = {s: {layer: (steps, list(np.abs(rng.normal(size=len(steps))) + 1)) for layer in range(a.layers)}
              for s in plots.CURVE_STATISTICS}
    norms = {f"layer.{i}.{k}": 1 + 0.1 * rng.normal(size=(len(steps), a.dim))
             for i in range(a.layers - 1) for k in ("attention_output", "output")}
    figures = {
        "metric curves": lambda: plots.metric_curves_figure(curves, title="benchmark"),
        "LayerNorm gain heatmap": lambda: plots.layernorm_heatmap(steps, norms, {n: [3] for n in norms}, "gain", 1.0),
        "mean vectors": lambda: plots.mean_vector_figure(rng.normal(size=(a.layers, a.dim)), [[3]] * a.layers, 0),
    }
    for name, build in figures.items():
        secs = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            image = plots.render(build())
            secs.append(time.perf_counter() - t0)
        print(f"{name:24s} {median(secs):6.2f} s  ({image.shape[1]} x {image.shape[0]} px)")


if __name__ == "__main__":
    main()
