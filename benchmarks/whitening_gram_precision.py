#!/usr/bin/env python
"""How much a float32 Gram would move whitening — the measurement behind evaluate.py's time floor.

    python benchmarks/whitening_gram_precision.py                  # MiniLM, the 2,000 default sentences
    python benchmarks/whitening_gram_precision.py --encoder PATH --n 500 --out results.json

The whitener (:class:`outlierlab.metrics.whitening.Whitener`) sums xxᵀ in float64 about the first vector (the
shifted-data algorithm).  Its Gram is the largest cost of ours in ``evaluate.py`` (docs/evaluation_scale.md): a
float64 GEMM runs at half the float32 rate on a CPU, and at 1/2–1/64 of it on GPUs.  This script takes the same
tokens (every hidden state, non-special tokens) and compares, per layer, Σ from the float64 sums with Σ from a
float32 Gram of each shifted batch, accumulated in float64 — the cheap alternative — and prints:

* ``rel_fro``: ‖Σ₃₂ − Σ₆₄‖_F / ‖Σ₆₄‖_F;
* ``eig_rel_max``: the largest relative change of an eigenvalue above the whitener's floor (1e-10 · λ₁);
* ``white_dev``: max |W₃₂ᵀ Σ₆₄ W₃₂ − I| over the directions above the floor (``kept_dims``; a post-LayerNorm
  layer's null direction is not whitened) — how far from white the float32-fitted map leaves the tokens (the
  float64 map's own deviation, ``white_dev_f64``, is the rounding baseline);
* ``cond``: λ₁ / λ_min of Σ₆₄, and ``outlier_var``: max / median per-dim variance (how outlier-heavy the layer is);
* ``null_f64``, ``null_f32``: the smallest eigenvalue of Σ over λ₁, signed -- a post-LayerNorm layer's null direction
  (its tokens satisfy one linear constraint), which the Whitener leaves unwhitened when it falls below its rank
  tolerance ``d · 1e4 · eps(float64)`` (``rank_tol``; 8.4e-10 at d = 384); ``rank_f64``, ``rank_f32``: the eigenvalues
  above it -- where they differ, a float32 Gram would whiten the null direction and amplify its rounding noise;
* the seconds of three Grams over all batches: torch's float64 GEMM, the float64 upper-triangular block products
  the Whitener now uses (:mod:`outlierlab.metrics.gram`: 5/8 of the multiply-adds), and a float32 GEMM.

Nothing here changes the product: it measures whether a float32 Gram would be acceptable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

EPS = 1e-10  # the Whitener's default floor


def covariances(batches, num_layers: int, dim: int):
    """Σ per layer from float64 and from float32 Grams of the same shifted batches, and each Gram's seconds:
    torch's float64 GEMM (the Whitener's product before), the float64 block-triangular Gram the Whitener uses now
    (:func:`outlierlab.metrics.gram.gram`; its Σ agrees with the GEMM's to ~1e-15) and a float32 GEMM."""
    import torch

    from outlierlab.metrics.gram import gram

    shift = None
    n, s64 = 0, torch.zeros(num_layers, dim, dtype=torch.float64)
    g64 = torch.zeros(num_layers, dim, dim, dtype=torch.float64)
    g32 = torch.zeros_like(g64)
    t64 = t32 = tblock = 0.0
    for x in batches:  # [L, N, d] float32
        if shift is None:
            shift = x[:, :1].double()
        y = x.double() - shift
        t0 = time.perf_counter()
        g64 += y.transpose(1, 2) @ y
        t64 += time.perf_counter() - t0
        t0 = time.perf_counter()
        gram(y)
        tblock += time.perf_counter() - t0
        y32 = y.float()  # the shifted tokens rounded to float32 once, as a float32 path would hold them
        t0 = time.perf_counter()
        g32 += (y32.transpose(1, 2) @ y32).double()
        t32 += time.perf_counter() - t0
        s64 += y.sum(1)
        n += x.shape[1]
    mu = s64 / n
    outer = mu[:, :, None] * mu[:, None, :] * n
    return (g64 - outer) / (n - 1), (g32 - outer) / (n - 1), n, t64, t32, tblock


def whitening_map(cov):
    import torch

    vals, vecs = torch.linalg.eigh(cov)
    vals, vecs = vals.flip(-1).clamp_min(0), vecs.flip(-1)
    floor = (EPS * vals[:, :1]).clamp_min(torch.finfo(torch.float64).tiny)
    return vals, vecs / vals.clamp_min(floor).sqrt().unsqueeze(1)


def null_direction(c64, c32) -> dict:
    """The smallest eigenvalue over the largest of each Σ (signed) and the rank by the Whitener's tolerance."""
    import torch

    tol = c64.shape[-1] * 1e4 * torch.finfo(torch.float64).eps  # outlierlab.metrics.whitening.Whitener.finalize
    out = {"rank_tol": tol}
    for name, c in (("f64", c64), ("f32", c32)):
        v = torch.linalg.eigvalsh(c)
        out[f"null_{name}"], out[f"rank_{name}"] = float(v[0] / v[-1]), int((v > tol * v[-1]).sum())
    return out


def compare(c64, c32) -> list[dict]:
    import torch

    v64, w64 = whitening_map(c64)
    v32, w32 = whitening_map(c32)
    eye = torch.eye(c64.shape[-1], dtype=torch.float64)
    rows = []
    for layer in range(c64.shape[0]):
        above = v64[layer] > EPS * v64[layer, 0]
        k = int(above.sum())  # directions the whitener scales to unit variance (a post-LN null one is not)
        var = torch.diagonal(c64[layer])
        rows.append({
            "layer": layer,
            "rel_fro": float((c32[layer] - c64[layer]).norm() / c64[layer].norm()),
            "eig_rel_max": float(((v32[layer] - v64[layer]).abs() / v64[layer])[above].max()),
            "white_dev": float((w32[layer, :, :k].T @ c64[layer] @ w32[layer, :, :k] - eye[:k, :k]).abs().max()),
            "white_dev_f64": float((w64[layer, :, :k].T @ c64[layer] @ w64[layer, :, :k] - eye[:k, :k]).abs().max()),
            "kept_dims": k,
            "cond": float(v64[layer, 0] / v64[layer][above][-1]),
            **null_direction(c64[layer], c32[layer]),
            "outlier_var": float(var.max() / var.median()),
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", default="all-minilm-l6-v2")
    ap.add_argument("--n", type=int, default=2000, help="sentences (the shipped ones, as evaluate.py's default)")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    a = ap.parse_args()
    import torch

    from outlierlab.datamodules.probe_data import load_position_texts
    from outlierlab.metrics.outlier_stats import valid_token_mask
    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder(a.encoder, device="cpu")
    texts = load_position_texts(None, a.n)
    tokens = [b.hidden[:, valid_token_mask(b.attention_mask, b.special_tokens_mask)]
              for b in enc.batches(enc.tokenize(texts), enc.batch_size, sort_by_length=True)]
    c64, c32, n, t64, t32, tblock = covariances(tokens, enc.num_layers + 1, enc.hidden_size)
    rows = compare(c64, c32)
    out = {"encoder": a.encoder, "sentences": len(texts), "tokens": n, "threads": torch.get_num_threads(),
           "gram_f64_s": round(t64, 3), "gram_f64_blocked_s": round(tblock, 3),
           "gram_f32_s": round(t32, 3), "layers": rows}
    print(f"{a.encoder}: {n} tokens, Gram float64 {t64:.2f} s (GEMM), {tblock:.2f} s (upper-triangular blocks, the Whitener's) vs "
          f"float32 {t32:.2f} s (GEMM; {t64 / t32:.2f}x and {tblock / t32:.2f}x faster)")
    print("layer  rel_fro    eig_rel_max  white_dev  (f64 baseline)  cond       max/median var  null f64 / f32       "
          "rank f64 / f32")
    for r in rows:
        print(f"{r['layer']:>5}  {r['rel_fro']:.2e}   {r['eig_rel_max']:.2e}     {r['white_dev']:.2e}   "
              f"({r['white_dev_f64']:.1e})       {r['cond']:.2e}   {r['outlier_var']:>5.1f}           "
              f"{r['null_f64']:+.1e} / {r['null_f32']:+.1e}   {r['rank_f64']} / {r['rank_f32']}")
    print(json.dumps(out))
    if a.out is not None:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
