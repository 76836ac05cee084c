#!/usr/bin/env python
"""Seconds to draw and save evaluate.py's figures (``outlierlab.reports.evaluation_report``), median of ``--repeat``.

    python benchmarks/evaluate_figure_cost.py                     # MiniLM's shapes: 7 layers x 384 dims, 3 transforms
    python benchmarks/evaluate_figure_cost.py --layers 33 --dim 4096

The per-layer line plot (anisotropy, IsoScore, self-similarity, WiC, STS: one line per transform), the mean-vector
panels of every layer (Luo et al. Figs. 1-2) and the one-panel position-vector figure, each written as a PNG.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=7, help="hidden-state layers (embeddings + blocks)")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    from outlierlab.reports.evaluation_report import plot_layers, plot_vectors

    rng = np.random.default_rng(0)
    vectors = [rng.normal(size=a.dim).tolist() for _ in range(a.layers)]
    marks = [np.argsort(-np.abs(v))[:3].tolist() for v in vectors]
    series = {t: rng.random(a.layers).tolist() for t in ("none", "clip", "whiten")}
    out = Path(tempfile.mkdtemp(prefix="outlierlab-figures-"))
    figures = {
        "per-layer line plot": lambda: plot_layers(out / "layers.png", series, "mean cosine of random token pairs",
                                                   "anisotropy, 1000 cross-sentence pairs", hline=0.1),
        f"mean vectors ({a.layers} panels)": lambda: plot_vectors(
            out / "vectors.png", vectors, [f"layer {i}" for i in range(a.layers)], marks,
            "average token vector per layer (Luo et al. Figs. 1–2)"),
        "position vector (1 panel)": lambda: plot_vectors(out / "position.png", vectors[:1], ["position table"],
                                                          marks[:1], "mean position vector (3σ dims marked)", ncols=1),
    }
    build = next(iter(figures.values()))
    build()  # matplotlib's first figure pays its font cache
    for name, draw in figures.items():
        secs = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            draw()
            secs.append(time.perf_counter() - t0)
        print(f"{name:28s} {median(secs):6.3f} s")


if __name__ == "__main__":
    main()
