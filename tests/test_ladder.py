"""The scale ladder: every rung composes and passes train.py's pre-flight check; the smallest rung trains a few
steps on CPU and writes every metric the ladder table reads; the table finds a planted Luo-type dimension."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from outlierlab.studies import ladder
from outlierlab.configuration.overrides import check_overrides
from outlierlab.jobs.startup import check_train_config
from tests.conftest import compose

RUNGS = {"4x128": (4, 128, 4), "4x256": (4, 256, 4), "6x384": (6, 384, 6), "8x512": (8, 512, 8), "12x768": (12, 768, 12)}


def test_every_rung_config_is_checked_here():
    # a rung added to configs/ladder/ without a row above would never be composed by the test below
    assert sorted(RUNGS) == sorted(p.stem for p in (Path(__file__).parents[1] / "configs" / "ladder").glob("*.yaml"))


@pytest.mark.parametrize("rung", sorted(RUNGS))
@pytest.mark.parametrize("pos", ["learned", "none", "rope"])
def test_every_rung_composes_and_passes_the_preflight_check(rung, pos, tmp_path):
    overrides = ["experiment=scale_ladder", f"ladder={rung}", f"pos={pos}", "trainer=gpu",
                 "+trainer.max_time=00:00:08:00"]
    check_overrides(["train.py", *overrides], config_name="train")  # what train.py checks before composing
    cfg = compose("train", [f"run_dir={tmp_path}", *overrides])
    assert check_train_config(cfg) == []
    layers, hidden, heads = RUNGS[rung]
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_heads) == (layers, hidden, heads)
    assert cfg.model.intermediate_size == 4 * hidden and cfg.data.block_size == cfg.model.max_len == 128
    assert cfg.model.dropout == 0.0 and cfg.data.batch_size == 128  # the order recipe, scaled


def test_model_medium_is_bert_medium():
    cfg = compose("train", ["model=medium"])
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.intermediate_size, cfg.model.num_heads,
            cfg.model.max_len) == (8, 512, 2048, 8, 512)


@pytest.mark.slow
def test_the_smallest_rung_trains_and_writes_what_the_table_reads(tmp_path, shared_cache):
    from outlierlab.jobs.training import train

    run = tmp_path / "cell"
    train(compose("train", [f"run_dir={run}", "experiment=scale_ladder", "ladder=4x128", "pos=learned",
                            "data.max_documents=400", "data.val_blocks=4", "data.batch_size=8",
                            "tokenizer.vocab_size=1000", "trainer.max_steps=5", "trainer.val_check_interval=5",
                            "callbacks.layernorm_monitor.every_n_steps=2", "callbacks.hidden_state_monitor.every_n_steps=2",
                            "trainer.enable_progress_bar=false", "export=false"]))
    table, summary = ladder.ladder_tables([tmp_path])
    got = set(zip(table["metric"], table["layer"]))
    for metric in ladder.PER_LAYER:
        assert {(metric, str(i)) for i in range(1, 5)} <= got, metric
    assert {("val/loss", "model"), ("val/order_use", "model"), ("layernorm/n_outlier_dims", "model")} <= got
    assert summary.loc[0, "rung"] == "4x128" and summary.loc[0, "last_step"] == 5
    assert summary.loc[0, "tokens"] == 5 * 8 * 128
    # the monitors' by-position rows reach the table, and the summary states the last step's profile
    assert {("abs_argmax_share_pos_1", str(i)) for i in range(1, 5)} <= got
    profile = summary.loc[0, "final_position_shares"].split()
    assert profile[0].startswith("1:") and all(0 <= float(p.split(":")[1]) <= 1 for p in profile)


def _plant(cell, steps_dims):
    (cell / "monitor").mkdir(parents=True)
    (cell / "csv").mkdir()
    (cell / "config.yaml").write_text("seed: 3\npos: {name: learned}\nmodel: {num_layers: 2, hidden_size: 16}\n"
                                      "data: {batch_size: 4, block_size: 8}\ntrainer: {devices: 1}\n")
    with open(cell / "monitor" / "hidden_states.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "name", "statistic", "dim", "value"])
        for step, dims in steps_dims.items():
            for layer, (dim, share) in enumerate(dims):
                w.writerow([step, f"layer_{layer}", "abs_argmax_share", dim, share])
                w.writerow([step, f"layer_{layer}", "kurtosis", "", 3.0])
    (cell / "monitor" / "layernorm.csv").write_text("step,name,statistic,dim,value\n0,model,n_outlier_dims,,0\n"
                                                    "250,model,n_outlier_dims,,2\n")
    (cell / "csv" / "metrics.csv").write_text("step,val/loss,val/order_use\n249,6.0,0.1\n499,5.5,0.6\n")


def test_the_table_finds_a_planted_luo_dimension(tmp_path, capsys):
    # layer_0 (embeddings) always concentrated: never counted; dim 5 holds both encoder layers from step 500
    _plant(tmp_path / "a", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 250: [(5, 0.9), (5, 0.7), (2, 0.3)],
                            500: [(5, 0.9), (5, 0.8), (5, 0.6)]})
    out = tmp_path / "out" / "ladder.csv"
    assert ladder.main([str(tmp_path / "a"), "--out", str(out)]) == 0
    summary = next(csv.DictReader(open(out.with_name("ladder_summary.csv"))))
    # half of 2 layers is one: step 250 already (layer 1), tokens = 250 * 4 * 8
    assert (summary["luo_step"], summary["luo_dim"], summary["luo_layers"], summary["luo_tokens"]) == \
        ("250", "5", "1", "8000")
    assert summary["ln_outlier_step"] == "250" and summary["val_loss_best"] == "5.5"
    # kept at both checkpoints from 250 on; at 500 it holds both layers at (0.8 + 0.6) / 2; layer_0's 0.9 not counted
    assert (summary["luo_kept"], summary["luo_final_dim"], summary["luo_final_layers"], summary["luo_final_share"],
            summary["max_share"]) == ("1", "5", "2", "0.7", "0.8")
    rows = list(csv.DictReader(open(out)))
    assert {"cell": "a", "rung": "2x16", "layers": "2", "hidden": "16", "objective": "mlm", "pos": "learned", "seed": "3", "step": "500",
            "tokens": "16000", "metric": "abs_argmax_dim", "layer": "2", "value": "5"} in rows
    # a stricter definition (a share >= 0.6 in every layer): step 250 (layer 2 at 0.3) no longer counts, 500 does
    strict = tmp_path / "out" / "strict.csv"
    assert ladder.main([str(tmp_path / "a"), "--out", str(strict), "--share", "0.6", "--layer-fraction", "1"]) == 0
    summary = next(csv.DictReader(open(strict.with_name("strict_summary.csv"))))
    assert (summary["luo_step"], summary["luo_layers"], summary["luo_final_share"]) == ("500", "2", "0.7")
    assert ladder.main([str(tmp_path / "a"), "--out", str(strict), "--share", "1.5"]) == 1
    assert "--share and --layer-fraction must be in (0, 1]" in capsys.readouterr().err
    assert ladder.main([str(tmp_path / "nothing-here"), "--out", str(out)]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_the_summary_states_the_most_concentrated_layers_profile_by_position(tmp_path):
    _plant(tmp_path / "c", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 500: [(5, 0.9), (5, 0.6), (3, 0.2)]})
    with open(tmp_path / "c" / "monitor" / "hidden_states.csv", "a", newline="") as fh:
        w = csv.writer(fh)
        for step, layer, bucket, share in ((0, 1, "1", 0.5), (500, 0, "1", 0.9), (500, 1, "16-31", 0.0),
                                           (500, 1, "2-3", 1.0), (500, 1, "1", 1.0), (500, 2, "1", 0.3)):
            w.writerow([step, f"layer_{layer}", f"abs_argmax_share_pos_{bucket}", 5, share])
    table, summary = ladder.ladder_tables([tmp_path / "c"])
    # layer 1 holds the largest share at step 500 (layer_0 is not an encoder layer); buckets in position order
    assert summary.iloc[0]["final_position_shares"] == "1:1.00 2-3:1.00 16-31:0.00"
    assert ((table["metric"] == "abs_argmax_share_pos_16-31") & (table["layer"] == "1")).sum() == 1
    # positional from step 500 (1.0 of buckets 1 and 2-3, 0.0 of 16-31); step 0's 0.5 and layer_0's 0.9 are not;
    # order use reaches 0.1 nats at the validation logged as step 249 (the monitors' step 250)
    row = summary.iloc[0]
    assert (row["marker_step"], row["marker_layer"], row["marker_dim"], row["marker_buckets"]) == (500, 1, 5, "1 2-3")
    assert row["order_use_step"] == 250
    _plant(tmp_path / "old", {0: [(5, 0.9), (1, 0.1), (2, 0.1)]})
    old = ladder.ladder_tables([tmp_path / "old"])[1].iloc[0]
    assert old["final_position_shares"] == "" and old["marker_buckets"] == "" and old["marker_step"] != old["marker_step"]


def test_the_markdown_trajectory_states_each_validated_step_and_the_two_events(tmp_path):
    _plant(tmp_path / "c", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 250: [(5, 0.9), (7, 0.3), (3, 0.2)],
                            500: [(5, 0.9), (5, 0.6), (3, 0.2)]})
    with open(tmp_path / "c" / "monitor" / "hidden_states.csv", "a", newline="") as fh:
        w = csv.writer(fh)
        for step, bucket, share in ((250, "1", 0.5), (250, "16-31", 0.2), (500, "1", 1.0), (500, "16-31", 0.0)):
            w.writerow([step, "layer_1", f"abs_argmax_share_pos_{bucket}", 5, share])
    out = tmp_path / "l.csv"
    assert ladder.main([str(tmp_path / "c"), "--out", str(out), "--markdown", str(tmp_path / "l.md")]) == 0
    md = (tmp_path / "l.md").read_text().splitlines()
    assert md[0] == "### 2x16 mlm pos=learned seed 3 (cell c, last step 500)"
    # validations logged at steps 249 and 499 are the monitors' 250 and 500: one row each, layers 1 and 2
    assert md[4:6] == ["| 250 | 6.000 | 0.10 | 0.30 (7) | 0.20 (3) |", "| 500 | 5.500 | 0.60 | 0.60 (5) | 0.20 (3) |"]
    assert md[7] == ("Order use >= 0.1 nats: from step 250. A position marker (a layer's dominant dimension holding "
                     ">= 0.9 of one position bucket's tokens and <= 0.1 of another's): from step 500 (layer 1, dim 5, "
                     "buckets 1).")


def test_an_xz_long_table_reads_as_the_plain_one(tmp_path):
    import pandas as pd

    _plant(tmp_path / "a", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 250: [(5, 0.9), (5, 0.7), (2, 0.3)]})
    assert ladder.main([str(tmp_path / "a"), "--out", str(tmp_path / "p" / "l.csv")]) == 0
    assert ladder.main([str(tmp_path / "a"), "--out", str(tmp_path / "x" / "l.csv.xz")]) == 0
    assert (tmp_path / "x" / "l.csv.xz").read_bytes()[:6] == b"\xfd7zXZ\x00"  # xz, not plain text
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "x" / "l.csv.xz"), pd.read_csv(tmp_path / "p" / "l.csv"))
    assert (tmp_path / "x" / "l_summary.csv").read_text() == (tmp_path / "p" / "l_summary.csv").read_text()


def test_two_cells_of_the_same_rung_pos_and_seed_keep_their_own_rows(tmp_path):
    # replicates (a packed study and a sweep folder of the same cells): each section is its own cell's numbers
    _plant(tmp_path / "r1", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 250: [(5, 0.9), (7, 0.3), (3, 0.2)]})
    _plant(tmp_path / "r2", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 250: [(5, 0.9), (8, 0.8), (3, 0.2)]})
    (tmp_path / "r2" / "csv" / "metrics.csv").write_text("step,val/loss,val/order_use\n249,9.0,0.0\n")
    table, summary = ladder.ladder_tables([tmp_path / "r1", tmp_path / "r2"])
    assert summary["cell"].tolist() == ["r1", "r2"]
    md = ladder.trajectories_markdown(table, summary)
    assert "| 250 | 6.000 | 0.10 | 0.30 (7) | 0.20 (3) |" in md and "| 250 | 9.000 | 0.00 | 0.80 (8) | 0.20 (3) |" in md
    assert md.count("| 250 |") == 2


def test_a_dimension_that_holds_every_position_is_not_a_position_marker(tmp_path):
    _plant(tmp_path / "d", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 250: [(5, 0.9), (5, 0.95), (3, 0.2)]})
    with open(tmp_path / "d" / "monitor" / "hidden_states.csv", "a", newline="") as fh:
        w = csv.writer(fh)
        for bucket, share in (("1", 1.0), ("2-3", 0.95), ("16-31", 0.92)):  # high everywhere: a Luo-type dim
            w.writerow([250, "layer_1", f"abs_argmax_share_pos_{bucket}", 5, share])
        for bucket, share in (("1", 0.85), ("16-31", 0.05)):  # 0.85: below MARKER_HIGH
            w.writerow([250, "layer_2", f"abs_argmax_share_pos_{bucket}", 3, share])
    row = ladder.ladder_tables([tmp_path / "d"])[1].iloc[0]
    assert row["marker_step"] != row["marker_step"] and row["marker_buckets"] == ""


def test_a_dimension_that_comes_and_goes_is_reported_as_such(tmp_path):
    # dim 5 holds layer 1 at step 250 only: first seen at 250, kept at 1 of the 2 checkpoints since, none at the end
    _plant(tmp_path / "b", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 250: [(5, 0.9), (5, 0.7), (2, 0.3)],
                            500: [(5, 0.9), (5, 0.4), (3, 0.2)]})
    table, summary = ladder.ladder_tables([tmp_path / "b"])
    row = summary.iloc[0]
    assert (row["luo_step"], row["luo_kept"], row["luo_final_layers"]) == (250, 0.5, 0)
    assert row["luo_final_dim"] != row["luo_final_dim"] and row["max_share"] == 0.7  # NaN: no dimension at the end


def test_a_packed_study_reads_as_its_cells(tmp_path):
    """A committed study table (.parquet) gives the same rows as the run directories it was packed from."""
    from outlierlab.studies.table import pack

    _plant(tmp_path / "sweep" / "a", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 250: [(5, 0.9), (5, 0.7), (2, 0.3)]})
    (tmp_path / "sweep" / "a" / ".hydra").mkdir()
    (tmp_path / "sweep" / "a" / ".hydra" / "overrides.yaml").write_text("- seed=3\n")
    pack(tmp_path / "sweep", tmp_path / "cells.parquet")
    direct, packed = ladder.ladder_tables([tmp_path / "sweep"]), ladder.ladder_tables([tmp_path / "cells.parquet"])
    assert direct[0].equals(packed[0]) and direct[1].equals(packed[1])
    assert packed[1].loc[0, "luo_step"] == 250


@pytest.mark.parametrize("name", ["ladder.csv", "ladder_summary.csv"])
def test_a_full_disk_leaves_no_table_cut_under_its_own_name(tmp_path, monkeypatch, name):
    from tests.disk_helpers import fill_disk_for

    _plant(tmp_path / "a", {0: [(5, 0.9), (1, 0.1), (2, 0.1)], 250: [(5, 0.9), (5, 0.7), (2, 0.3)]})
    fill_disk_for(monkeypatch, name, left=60)
    with pytest.raises(OSError, match="No space left"):
        ladder.main([str(tmp_path / "a"), "--out", str(tmp_path / "out" / "ladder.csv")])
    monkeypatch.undo()
    out = tmp_path / "out"
    assert not (out / name).exists() and not [p for p in out.iterdir() if "partial" in p.name]
