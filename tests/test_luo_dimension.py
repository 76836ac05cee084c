"""The Luo-type dimension's definition on planted per-layer rows."""

import pytest

from outlierlab.metrics.luo_dimension import luo_by_step, luo_dimension


def first_luo_step(rows, num_layers, **kw):
    """The first step with a Luo-type dimension (the ladder's table reports it): ``(step, dim, n_layers)`` or None."""
    return next(((step, f[0], f[1]) for step, f in luo_by_step(rows, num_layers, **kw).items() if f is not None), None)


def test_one_dimension_in_half_the_layers_is_one():
    # 4 layers: dim 77 holds >= 0.5 of tokens in layers 1 and 3 (2 of 4 = half), other layers elsewhere
    assert luo_dimension({1: (77, 0.63), 2: (12, 0.9), 3: (77, 0.5), 4: (77, 0.49)}, 4) == (77, 2)
    assert luo_dimension({1: (77, 0.63), 2: (12, 0.9), 3: (77, 0.49), 4: (77, 0.49)}, 4) is None  # 1 of 4
    # different dimensions dominant in different layers are not one dimension
    assert luo_dimension({1: (5, 0.9), 2: (6, 0.9), 3: (7, 0.9), 4: (8, 0.9)}, 4) is None
    # the embedding output (layer 0) does not count; 5 layers need 3
    assert luo_dimension({0: (9, 1.0), 1: (9, 0.7), 2: (9, 0.7), 3: (1, 0.2)}, 5) is None
    assert luo_dimension({1: (9, 0.7), 2: (9, 0.7), 3: (9, 0.6)}, 5) == (9, 3)
    with pytest.raises(ValueError):
        luo_dimension({}, 0)


def test_the_first_step_it_appears():
    rows = [(0, 1, 3, 0.1), (0, 2, 3, 0.1),
            (250, 1, 78, 0.55), (250, 2, 40, 0.3),
            (500, 1, 78, 0.8), (500, 2, 78, 0.6)]
    assert first_luo_step(rows, 2) == (250, 78, 1)  # half of 2 layers is one
    assert first_luo_step(rows, 2, layer_fraction=1.0) == (500, 78, 2)
    assert first_luo_step(rows[:2], 2) is None


def test_every_step_s_dimension_with_its_mean_share_where_it_holds():
    rows = [(0, 1, 3, 0.1), (0, 2, 3, 0.1),
            (250, 1, 78, 0.55), (250, 2, 40, 0.3),
            (500, 1, 78, 0.8), (500, 2, 78, 0.6),
            (750, 1, 78, 0.45), (750, 2, 12, 0.9)]  # 78 lost; 12 holds one layer of two (half): another one
    got = luo_by_step(rows, 2)
    assert list(got) == [0, 250, 500, 750]
    assert got[0] is None and got[250] == (78, 1, 0.55)
    assert got[500] == (78, 2, pytest.approx(0.7))  # (0.8 + 0.6) / 2
    assert got[750] == (12, 1, 0.9)  # half of 2 layers is one: another dimension now
    assert luo_by_step(rows, 2, layer_fraction=1.0)[750] is None
