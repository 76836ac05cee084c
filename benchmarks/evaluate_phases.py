#!/usr/bin/env python
"""Wall-clock seconds of each phase of evaluate's sentence pass, in one process, without a profiler's overhead.

    OMP_NUM_THREADS=1 python benchmarks/evaluate_phases.py            # MiniLM, the 2,000 default sentences, 1 thread
    python benchmarks/evaluate_phases.py --threads 2 --n 500
    python benchmarks/evaluate_phases.py --analyses wic               # WiC's own pass and fit
    python benchmarks/evaluate_phases.py transform.fit_on=sentences --analyses wic   # any evaluate.py override, first

The methods of the stream (:class:`outlierlab.evaluation.sentence_stream.LayerStream`: ``forward``, ``fit``, ``replay``,
``_feed``), of its subscribers (``update``), of the token store and of the whitener are wrapped in timers and
``ol.evaluate`` runs the analyses (figures off, the model loaded first).  Phases nest (``_feed`` runs inside
``forward`` and ``replay``; ``partial_fit`` inside ``fit``): read each line as the time spent inside that method.
cProfile would charge every Python call of the per-batch loops and move the shares (it did, by ~15 %).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SENTENCE_ANALYSES = ["outliers", "anisotropy", "isotropy", "self_similarity"]


def timed(owner, name: str, seconds: dict, calls: collections.Counter) -> None:
    """Replace ``owner.name`` by a wrapper adding its wall time to ``seconds[label]``."""
    fn, label = getattr(owner, name), f"{owner.__name__}.{name}"

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - t0
            calls[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", default="all-minilm-l6-v2")
    ap.add_argument("--n", type=int, default=2000, help="evaluation sentences (data.max_sentences)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--analyses", nargs="+", default=SENTENCE_ANALYSES)
    ap.add_argument("overrides", nargs="*", help="more evaluate.py overrides, e.g. transform.fit_on=sentences")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    import outlierlab as ol
    from outlierlab.metrics.whitening import Whitener
    from outlierlab.datamodules.features import LayerTokenStore
    from outlierlab.evaluation.activation_pass import ActivationObserver
    from outlierlab.evaluation.sentence_stream import LayerStream
    from outlierlab.evaluation.sentence_pass import AnisotropyReservoir, OutlierCounts, WordSimilarity
    from outlierlab.evaluation.analyses.wic_targets import TargetMeans

    seconds: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    for owner, names in [(LayerStream, ("forward", "fit", "replay", "_feed")), (Whitener, ("partial_fit", "transform")),
                         (LayerTokenStore, ("append", "rows"))]:
        for name in names:
            timed(owner, name, seconds, calls)
    for consumer in (OutlierCounts, AnisotropyReservoir, WordSimilarity, ActivationObserver, TargetMeans):
        timed(consumer, "update", seconds, calls)
    enc = ol.load_encoder(a.encoder, device="cpu")
    enc.model  # loaded before the clock starts, as a bare forward's model is
    t0 = time.perf_counter()
    ol.evaluate(enc, analyses=a.analyses, overrides=[f"data.max_sentences={a.n}", *a.overrides], progress=False)
    total = time.perf_counter() - t0
    print(f"evaluate {', '.join(a.analyses)}: {total:.1f} s ({a.n} sentences, {a.threads} thread(s))")
    for label, secs in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {label:32s} {secs:7.2f} s  {calls[label]:6d} calls")


if __name__ == "__main__":
    main()
