#!/usr/bin/env python
"""Time the position probe (Luo et al. 2021 §3) on all layers in one pass vs one layer vs a naive loop.

    python benchmarks/probe_all_layers.py [--encoder all-minilm-l6-v2] [--sentences 300] [--epochs 2]

1. extract: encode the sentences once, cache every layer (outlierlab.datamodules.features);
2. all layers: one PositionProbe with a [L+1, d, M] weight trained on the cached features in one pass;
3. one layer: the same probe for a single layer (what one iteration of a per-layer loop costs);
4. naive: for every layer, re-encode the sentences and train that layer's probe alone.
Prints the wall times and the ratios.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from outlierlab.datamodules.features import RowBatches, extract_features, row_loader  # noqa: E402
from outlierlab.datamodules.probe_data import load_position_texts, split_indices  # noqa: E402
from outlierlab.lightning_modules.probes import PositionProbe, train_probe  # noqa: E402
from outlierlab.models.loading import FrozenEncoder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoder", default="all-minilm-l6-v2")
    ap.add_argument("--sentences", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--max-positions", type=int, default=300)
    ap.add_argument("--device", default="auto", help="encoder device (the probe uses Lightning's 'auto')")
    ap.add_argument("--repeat", type=int, default=2, help="probe timings: best of N (after one warm-up run)")
    ap.add_argument("--skip-naive", action="store_true")
    args = ap.parse_args()

    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    texts = load_position_texts(None, args.sentences)
    m = args.max_positions

    def probe(fs, layers):
        split = split_indices(len(texts), (0.8, 0.1, 0.1), 0)
        rows = {s: np.intersect1d(fs.token_rows(ids), np.flatnonzero(fs.position < m)) for s, ids in split.items()}
        ds = {s: RowBatches(fs.tokens, r, fs.position[r], layers=layers) for s, r in rows.items()}
        n_layers = fs.num_layers if layers is None else len(layers)
        module = PositionProbe(n_layers, fs.dim, m, layer_ids=layers)
        t = time.perf_counter()
        train_probe(module, row_loader(ds["train"], args.batch_size, True), row_loader(ds["validation"], 512, False),
                    row_loader(ds["test"], 512, False), epochs=args.epochs, validate=False)
        return time.perf_counter() - t, len(rows["train"])

    with tempfile.TemporaryDirectory() as tmp:
        enc = FrozenEncoder(args.encoder, device=args.device)
        _ = enc.model  # load weights outside the timings
        t = time.perf_counter()
        fs = extract_features(enc, texts, Path(tmp) / "cache0", progress=False)
        t_extract = time.perf_counter() - t
        n_layers = fs.num_layers
        mid = n_layers // 2
        probe(fs, [mid])  # warm-up: first Trainer/dataloader/BLAS calls are slower
        t_all, n_train = min(probe(fs, None) for _ in range(args.repeat))
        t_one, _ = min(probe(fs, [mid]) for _ in range(args.repeat))
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}")
        print(f"encoder {args.encoder}: {n_layers} hidden-state layers, d={fs.dim}, {len(texts)} sentences, "
              f"{fs.meta['n_tokens']} tokens ({n_train} train), {args.epochs} epochs, batch {args.batch_size}, "
              f"M={m}, probe device: Lightning auto, encoder device: {enc.device}")
        print(f"extract once (all layers, cached): {t_extract:8.2f} s")
        print(f"probe ALL {n_layers} layers in one pass: {t_all:8.2f} s")
        print(f"probe ONE layer alone:              {t_one:8.2f} s")
        print(f"  -> all-at-once vs a loop over layers on cached features: {n_layers * t_one / t_all:.2f}x faster "
              f"({n_layers} x {t_one:.2f} s vs {t_all:.2f} s); all/one = {t_all / t_one:.2f}")
        if not args.skip_naive:
            t = time.perf_counter()
            for layer in range(n_layers):  # re-encode for every layer (fresh cache dir), probe that layer
                fsl = extract_features(enc, texts, Path(tmp) / f"naive{layer}", progress=False)
                probe(fsl, [layer])
            t_naive = time.perf_counter() - t
            print(f"naive re-encode + probe per layer:  {t_naive:8.2f} s")
            print(f"  -> extract once + all layers at once is {t_naive / (t_extract + t_all):.2f}x faster than naive "
                  f"({t_naive:.2f} s vs {t_extract + t_all:.2f} s)")


if __name__ == "__main__":
    main()
