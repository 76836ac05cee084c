"""The |x|-argmax share by position (outlierlab.metrics.position_shares): buckets by hand, counts by hand, the
buckets adding up to the layer's share, positions under left padding, and the table evaluate returns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from outlierlab.metrics.activations import ActivationAccumulator
from outlierlab.metrics.position_shares import PositionArgmaxCounts, bucket_positions, position_bucket


def test_buckets_double_in_width():
    p = torch.tensor([0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 1023, 1024, 2047])
    assert position_bucket(p).tolist() == [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 10, 11, 11]
    for b in range(14):
        first, last = bucket_positions(b)
        assert position_bucket(torch.tensor([first, last, last + 1])).tolist() == [b, b, b + 1]
    with pytest.raises(ValueError, match=">= 0"):
        position_bucket(torch.tensor([3, -1]))


def _one_hot(dims: list[int], d: int = 4, big: float = 5.0) -> torch.Tensor:
    x = torch.full((len(dims), d), 0.1)
    x[torch.arange(len(dims)), torch.tensor(dims)] = -big  # negative: the argmax is of |x|
    return x


def test_counts_by_hand():
    acc = PositionArgmaxCounts(num_layers=1, dim=4)
    # positions 1..7: dim 2 at positions 1-3 and at 4 of 4-7 ... dim 0 at 5, 6, 7
    acc.update(0, _one_hot([2, 2, 2, 2, 0, 0, 0]), torch.arange(1, 8))
    acc.update(0, _one_hot([3]), torch.tensor([1]))  # a second batch: bucket 1 now has two tokens
    rows = acc.rows()
    assert [r["positions"] for r in rows] == ["1", "2-3", "4-7"]
    assert [r["n_tokens"] for r in rows] == [2, 2, 4]
    # over all 8 tokens dim 2 holds 4 and dim 0 holds 3: the layer's dim is 2
    assert {r["layer_dim"] for r in rows} == {2}
    assert [r["layer_dim_share"] for r in rows] == [0.5, 1.0, 0.25]
    assert [(r["abs_argmax_dim"], r["abs_argmax_share"]) for r in rows[1:]] == [(2, 1.0), (0, 0.75)]
    assert rows[0]["abs_argmax_share"] == 0.5
    with pytest.raises(ValueError, match=r"vectors \[N, 4\]"):
        acc.update(0, torch.zeros(3, 5), torch.arange(3))


def test_the_buckets_add_up_to_the_layers_share():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3000, 16, generator=g)
    x[:, :1000, 5] += 6.0  # a dim that dominates early tokens only
    positions = torch.randint(1, 128, (3000,), generator=g).sort().values
    whole = ActivationAccumulator(2, 16)
    whole.update(x)
    acc = PositionArgmaxCounts(2, 16)
    for layer in range(2):
        acc.update(layer, x[layer], positions)
    rows = acc.rows()
    for layer, summary in enumerate(whole.summary()):
        mine = [r for r in rows if r["layer"] == layer]
        assert sum(r["n_tokens"] for r in mine) == 3000
        assert mine[0]["layer_dim"] == summary["abs_argmax_dim"] == 5
        overall = sum(r["n_tokens"] * r["layer_dim_share"] for r in mine) / 3000
        assert overall == pytest.approx(summary["abs_argmax_share"], abs=1e-12)
        assert mine[0]["layer_dim_share"] > 0.9 and mine[-1]["layer_dim_share"] < 0.2  # positional, by planting


def test_positions_count_real_tokens_under_left_padding():
    from outlierlab.evaluation.activation_pass import ActivationObserver

    obs = ActivationObserver(SimpleNamespace(hidden_size=4, num_layers=0))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1],   # left-padded: positions 0..3 in columns 2..5
                         [1, 1, 1, 1, 1, 1]])
    valid = mask.bool().clone()
    valid[0, 2] = valid[1, 0] = False  # the first real token of each row is special
    # row 0: positions 1, 2, 3 -> dims 1, 1, 1; row 1: positions 1..5 -> dims 1, 1, 3, 3, 3
    vectors = _one_hot([1, 1, 1, 1, 1, 3, 3, 3])[None]
    batch = SimpleNamespace(attention_mask=mask, valid=valid, token_ids=None)
    obs.update(0, vectors, batch)
    rows = {r["positions"]: r for r in obs.by_position.rows()}
    assert {k: r["n_tokens"] for k, r in rows.items()} == {"1": 2, "2-3": 4, "4-7": 2}
    assert {k: r["abs_argmax_dim"] for k, r in rows.items()} == {"1": 1, "2-3": 1, "4-7": 3}
    # read by column instead, row 0's tokens would sit at positions 3-5 and bucket "1" would hold one token


def test_evaluate_returns_the_table_and_it_adds_up_to_the_outliers_rows():
    import outlierlab as ol
    from outlierlab.datamodules.eval_data import load_sentences

    tables = ol.evaluate(ol.load_encoder("all-minilm-l6-v2"), load_sentences()[:60], analyses=["outliers"],
                         transforms=["none"], progress=False)
    by_pos, outl = tables["outliers_by_position"], tables["outliers"]
    assert list(by_pos.columns)[:5] == ["layer", "positions", "first_position", "last_position", "n_tokens"]
    for _, row in outl.iterrows():
        mine = by_pos[by_pos.layer == row.layer]
        assert mine.n_tokens.sum() == row.n_tokens
        assert (mine.layer_dim == row.abs_argmax_dim).all()
        assert (mine.n_tokens * mine.layer_dim_share).sum() / row.n_tokens == pytest.approx(row.abs_argmax_share)
    assert (by_pos.first_position >= 1).all()  # [CLS] at position 0 is special, never counted


def test_the_profile_table_puts_runs_side_by_side(tmp_path, capsys):
    from outlierlab.studies.position_profile import main

    for name, early in (("a", 1.0), ("b", 0.2)):
        run = tmp_path / name
        run.mkdir()
        (run / "outliers_by_position.csv").write_text(
            "layer,positions,first_position,last_position,n_tokens,abs_argmax_dim,abs_argmax_share,layer_dim,"
            f"layer_dim_share\n1,1,1,1,10,7,{early},7,{early}\n1,2-3,2,3,30,3,0.5,7,0.0\n")
        (run / "outliers.csv").write_text(f"layer,transform,abs_argmax_share\n1,none,{early * 10 / 40}\n"
                                          "1,clip,0.9\n")
    (tmp_path / "not_a_run").mkdir()
    single = tmp_path / "c"  # only single-position buckets: "1" is still the label of run a's first bucket
    single.mkdir()
    (single / "outliers_by_position.csv").write_text(
        "layer,positions,first_position,last_position,n_tokens,abs_argmax_dim,abs_argmax_share,layer_dim,"
        "layer_dim_share\n1,1,1,1,10,7,0.5,7,0.5\n")
    (single / "outliers.csv").write_text("layer,transform,abs_argmax_share\n1,none,0.5\n")
    assert main([str(tmp_path), "--layers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| run | layer | dim | pos. 1 | pos. 2-3 | all tokens |"
    assert lines[2:] == ["| a | 1 | 7 | 1.00 | 0.00 | 0.250 |", "| b | 1 | 7 | 0.20 | 0.00 | 0.050 |",
                         "| c | 1 | 7 | 0.50 | – | 0.500 |"]
    assert main([str(tmp_path / "missing")]) == 2 and "not a folder" in capsys.readouterr().err


def test_the_monitors_record_the_share_by_position_and_it_adds_up():
    from outlierlab.metrics.monitor_records import hidden_state_records

    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 4, 40, 8, generator=g)  # [L, B, T, d]
    hidden[1, :, :, 6] = 0.0
    hidden[1, :, :16, 6] = 8.0  # layer 1: dim 6 holds the first 16 columns, and only them
    mask = torch.ones(4, 40, dtype=torch.long)
    mask[2, :10] = 0  # row 2 left-padded: its positions start at column 10, so dim 6 holds positions 0-5 there
    mask[3, 30:] = 0  # row 3 right-padded
    special = torch.zeros_like(mask)
    special[:, 0] = 1
    special[2, 10] = 1  # row 2's first real token
    rows, summary = hidden_state_records(7, hidden, mask, special, vectors=False)
    pos = {r[2]: (r[3], r[4]) for r in rows if r[1] == "layer_1" and r[2].startswith("abs_argmax_share_pos_")}
    # layer 1's dim holds 3 rows x 15 + row 2's 5 = 50 of the positions 1-15, and nothing after
    assert {k: v[0] for k, v in pos.items()} == dict.fromkeys(pos, 6)
    # positions 1-3 held in every row; row 2 holds 4-5 of 4-7 and none of 8-15 (read by column, it would hold
    # all of 8-15's real tokens in its columns 10-15 and none of 4-7)
    assert [pos[f"abs_argmax_share_pos_{b}"][1] for b in ("1", "2-3")] == [1.0, 1.0]
    assert pos["abs_argmax_share_pos_4-7"][1] == pytest.approx(14 / 16)
    assert pos["abs_argmax_share_pos_8-15"][1] == pytest.approx(24 / 32)
    assert pos["abs_argmax_share_pos_16-31"][1] == 0.0
    n = {r[1]: r[4] for r in rows if r[2] == "n_tokens"}
    share = {r[1]: (r[3], r[4]) for r in rows if r[2] == "abs_argmax_share"}
    counts = {r["positions"]: r["n_tokens"] for r in summary["position_shares"] if r["layer"] == 1}
    assert sum(counts.values()) == n["layer_1"]
    weighted = sum(counts[k.removeprefix("abs_argmax_share_pos_")] * v[1] for k, v in pos.items()) / n["layer_1"]
    assert share["layer_1"][0] == 6 and weighted == pytest.approx(share["layer_1"][1])
