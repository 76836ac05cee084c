"""probe.py and evaluate.py fit their transforms through one API (:mod:`outlierlab.metrics.transform_fit`)."""

import numpy as np
import pytest
import torch

from outlierlab.metrics.outlier_dims import detect_outlier_dims
from outlierlab.metrics.outlier_stats import OutlierAccumulator
from outlierlab.metrics.transform_fit import FittedTransforms, WhitenSettings, clip_dims, fit_transform
from outlierlab.metrics.transforms import FITTED, TRANSFORMS, DegenerateWhiteningError, Whitener

STATE = ("mean", "W", "cov", "singular_values", "rank", "n_distinct")


def test_probe_and_evaluate_fit_the_same_maps_from_the_same_vectors():
    g = torch.Generator().manual_seed(5)
    n_layers, n, d = 3, 300, 16
    x = torch.randn(n_layers, n, d, generator=g) @ torch.randn(d, d, generator=g)  # float32, as the features
    x[:, :, 5] += 25.0  # an outlier dim in every layer, a second one in the last
    x[2, :, 9] -= 40.0
    spans = [(0, 128), (128, 256), (256, n)]
    stats = OutlierAccumulator(n_layers, d)
    stats.update(x)
    detected = detect_outlier_dims(stats)
    assert detected[0] == [5] and 9 in detected[2]
    what = "the test vectors"
    # probe.py: one transform at a time, each from its own pass over the (rows, [L, n, d]) training chunks
    probe = {name: fit_transform(name, n_layers, d, lambda: ((np.arange(a, b), x[:, a:b]) for a, b in spans),
                                 detected, k=10, abtt_d=3, fit_what=what) for name in TRANSFORMS}
    # ... which are the maps probe.py fitted before the one API: its CSVs do not change
    for name in FITTED:
        own = Whitener(n_layers, d, k=10 if name == "whiten" else None, method=name,
                       abtt_d=3 if name == "abtt" else None)
        for a, b in spans:
            own.partial_fit(x[:, a:b])
        own.finalize()
        assert all(torch.equal(getattr(own, s), getattr(probe[name].whitener, s)) for s in STATE), name
    # evaluate.py: every map from ONE set of float64 sums, kept with clip's dims in a FittedTransforms
    fit = WhitenSettings(k=10, abtt_d=3)
    ft = FittedTransforms()
    ft.clip_dims, ft.info["clip"] = clip_dims(n_layers, d, detected=detected)
    ft.set_all(fit.fit_all(fit.fit_chunks(n_layers, d, (x[:, a:b] for a, b in spans)), FITTED, what, compact=False))
    for name in TRANSFORMS:
        mine, theirs = probe[name], ft.get(name, d)
        assert (mine.info, mine.columns(), mine.clip_dims, mine.out_dim) == \
            (theirs.info, theirs.columns(), theirs.clip_dims, theirs.out_dim), name
        if name in FITTED:
            assert all(torch.equal(getattr(mine.whitener, s), getattr(theirs.whitener, s)) for s in STATE), name
        assert torch.equal(mine(x), theirs(x)), name
    # evaluate.py's own maps are compact (float32 Σ and W in the sums' memory): its two-pass stream of
    # [L, n, d] chunks and its store read layer by layer fit the same maps ...
    compact = {}
    for names in (("whiten", "standardize", "center"), ("standardize", "abtt")):
        stream = fit.fit_all(fit.fit_chunks(n_layers, d, (x[:, a:b] for a, b in spans)), names, what)
        store = fit.fit_all(fit.fit_by_layer(n_layers, d, lambda layer: (x[layer, a:b] for a, b in spans), names),
                            names, what)
        for name in names:
            (s, s_fit), (t, t_fit) = stream[name], store[name]
            assert s.compact and s_fit == t_fit and torch.equal(s.mean, t.mean) and torch.equal(s.W, t.W), name
            compact[name] = t
    # ... and whiten and center are probe's maps in float32; standardize and abtt are read from the float32 Σ
    # (evaluate.py's numbers), so they match probe's float64 ones to float32 rounding only
    for name in FITTED:
        w, ref = compact[name], probe[name].whitener
        assert torch.equal(w.mean, ref.mean), name
        if name in ("whiten", "center"):
            assert torch.equal(w.W, ref.W.float()), name
        else:
            assert torch.allclose(w.W.double(), ref.W, rtol=1e-4, atol=1e-6), name
    # one guard, one message, whichever caller fits
    with pytest.raises(DegenerateWhiteningError, match="whitening fit on the test vectors is degenerate") as one:
        fit_transform("whiten", n_layers, d, lambda: [(None, x)], k=10, fit_what=what, min_ratio=40)
    strict = WhitenSettings(k=10, min_ratio=40)
    with pytest.raises(DegenerateWhiteningError) as other:
        strict.fit_all(strict.fit_chunks(n_layers, d, [x]), ["whiten"], what)
    assert str(one.value) == str(other.value)
