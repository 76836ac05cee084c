"""Which dimension, since when (outlierlab.studies.dim_identity): hand-built histories, then the committed cells."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from outlierlab.metrics.layer_identity import layer_identity
from outlierlab.studies import dim_identity as di

ROOT = Path(__file__).resolve().parent.parent
SCHEMES = ROOT / "docs" / "order_use" / "cells_schemes_large.parquet"
CUT = ROOT / "docs" / "order_use" / "cells_schemes_large_cut.parquet"


def history(dims: dict[str, list[int]], steps=(0, 250, 500, 750)) -> pd.DataFrame:
    rows = [{"step": s, "name": name, "statistic": "abs_argmax_share", "dim": d, "value": 0.1 * (i + 1)}
            for name, ds in dims.items() for i, (s, d) in enumerate(zip(steps, ds))]
    rows += [{"step": s, "name": "layer_1", "statistic": "argmax_share", "dim": 99, "value": 0.5} for s in steps]
    rows += [{"step": s, "name": "model", "statistic": "abs_argmax_share", "dim": 7, "value": 0.5} for s in steps]
    return pd.DataFrame(rows)


def test_held_since_is_the_start_of_the_final_dimensions_unbroken_run():
    t = layer_identity(history({"layer_0": [3, 3, 4, 4], "layer_1": [5, 7, 7, 7], "layer_2": [7, 7, 7, 7],
                                   "layer_3": [7, 2, 3, 9]}))
    assert t["layer"].tolist() == [0, 1, 2, 3]
    assert t["dim"].tolist() == [4, 7, 7, 9]
    assert t["held_since"].tolist() == [500, 250, 0, 750]  # layer 3 held 7 at step 0, but not unbroken
    assert t["held_fraction"].tolist() == pytest.approx([1 / 3, 2 / 3, 1.0, 0.0])
    assert t["share"].tolist() == pytest.approx([0.4] * 4)  # the last record's value
    assert t["layers_sharing"].tolist() == [1, 2, 2, 1]  # the 'model' row and the argmax_share rows ignored


def test_the_summary_counts_seeds_ending_on_the_previous_layers_dimension():
    a = layer_identity(history({"layer_0": [1] * 4, "layer_1": [5] * 4, "layer_2": [5] * 4}))
    b = layer_identity(history({"layer_0": [1] * 4, "layer_1": [1] * 4, "layer_2": [6] * 4}))
    # seed 1 began to use order between the validations at 0 and 250 (its dimensions held since 0: not in that
    # interval), seed 2 never did
    table = pd.concat([a.assign(group="pos=x", folder="f", data="d", objective="mlm", pos="x", seed=s, use_before=u[0],
                                use_from=u[1])
                       for s, a, u in ((1, a, (0, 250)), (2, b, (float("nan"),) * 2))])
    s = di.summary(table).set_index("layer")
    assert s["as_previous"].tolist() == [0, 1, 1]  # seed 1 at layer 2, seed 2 at layer 1
    assert s["layers_sharing"].tolist() == [1.5, 2.0, 1.5]
    assert s["held_fraction"].tolist() == [1.0] * 3 and (s["seeds"] == 2).all()
    assert s["with_use"].tolist() == [0, 0, 0] and s["use_measured"].tolist() == [1, 1, 1]
    table.loc[(table["seed"] == 1) & (table["layer"] == 2), "held_since"] = 250  # settled in the interval
    assert di.summary(table).set_index("layer")["with_use"].tolist() == [0, 0, 1]


def test_a_history_without_the_rows_is_one_line():
    with pytest.raises(ValueError, match="no 'argmin_share' rows"):
        layer_identity(history({"layer_0": [1] * 4}), "argmin_share")


def test_the_committed_scheme_cells(tmp_path):
    """Sinusoidal seed 1 on english_large: its layer 2 ends on dimension 31, held over the last records; the cells
    the clock stopped (seeds 4-5) come in only with --until."""
    assert di.main([str(SCHEMES), str(CUT), "--out", str(tmp_path)]) == 0
    t = pd.read_csv(tmp_path / "dim_identity.csv")
    assert set(t["seed"]) == {1, 2, 3} and len(t) == 4 * 3 * 5
    row = t[(t["pos"] == "sinusoidal") & (t["seed"] == 1) & (t["layer"] == 2)].iloc[0]
    assert row["dim"] == 31 and row["last_step"] == 6000 and row["held_since"] <= 4750
    # every scheme's order use was above 0.1 nats at its first validation, after 1,000 steps
    assert (t["use_from"] == 1000).all() and (t["use_before"] == 0).all()
    assert "Left out:" in (tmp_path / "dim_identity.md").read_text()
    assert di.main([str(SCHEMES), str(CUT), "--until", "4000", "--out", str(tmp_path / "until")]) == 0
    u = pd.read_csv(tmp_path / "until" / "dim_identity.csv")
    assert set(u["seed"]) == {1, 2, 3, 4, 5} and (u["last_step"] == 4000).all()
    assert u["held_fraction"].between(0, 1).all()


def test_a_loop_monitors_history_and_a_run_directory_from_the_api():
    """The committed MiniLM fine-tune (examples/sentence_transformers_finetune.py; the monitor's out_dir): a pretrained
    model's dimensions, 63 in layers 0-2 and 6, 223 in layers 3-5, held from the first record to the last.  A train.py
    run directory (an exported cell) gives the job's rows for it."""
    import outlierlab as ol

    t = ol.dim_identity(ROOT / "docs" / "loop_monitors" / "minilm_wic")
    assert t["dim"].tolist() == [63, 63, 63, 223, 223, 223, 63]
    assert (t["held_since"] == 0).all() and t["layers_sharing"].tolist() == [4, 4, 4, 3, 3, 3, 4]
    cell = SCHEMES / "pos=sinusoidal,seed=1"
    job = di.collect([cell])[0].drop(columns=["group", "folder", "data", "objective", "pos", "seed", "use_before",
                                              "use_from"])
    pd.testing.assert_frame_equal(ol.dim_identity(cell), job)
    with pytest.raises(FileNotFoundError, match="no monitor history at"):
        ol.dim_identity(ROOT / "docs")


def test_a_live_history_torn_mid_line_is_read_to_its_last_complete_row(tmp_path):
    """A monitor killed mid-write leaves its last line cut ("layer_6,abs_argmax_share,223" cut to "2"): ol.dim_identity
    reads the file as the monitors do, so the cut row does not become the layer's last dimension."""
    import outlierlab as ol

    text = (ROOT / "docs" / "loop_monitors" / "minilm_wic" / "hidden_states.csv").read_text()
    last = max(int(line.split(",")[0]) for line in text.splitlines()[1:])
    (tmp_path / "hidden_states.csv").write_text(text + f"{last + 1},layer_6,abs_argmax_share,2")
    pd.testing.assert_frame_equal(ol.dim_identity(tmp_path), ol.dim_identity(ROOT / "docs" / "loop_monitors"
                                                                             / "minilm_wic"))


def test_cells_that_differ_in_another_override_are_other_groups(tmp_path):
    """The committed switch study (plain, OP block, pre-LN; all learned positions, 5 seeds each): three groups named
    by the override that differs, not one pooled 'learned' group."""
    table, _ = di.collect([ROOT / "docs" / "emergence" / "switch_seeds_gpu.parquet"])
    assert sorted(table["group"].unique()) == ["arch=default", "arch=op", "arch=pre_ln"]
    s = di.summary(table)
    assert (s["seeds"] == 5).all() and len(s) == 3 * 5


def test_a_missing_folder_is_one_line(tmp_path, capsys):
    assert di.main([str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_job_takes_a_loop_monitors_folder_as_the_api_does(tmp_path, capsys):
    """`python -m outlierlab.studies.dim_identity` on a monitor's out_dir and on a Trainer's output_dir (its monitor/):
    the rows ol.dim_identity gives; cells and monitor folders together are refused in one line."""
    import shutil

    import outlierlab as ol

    monitor = ROOT / "docs" / "loop_monitors" / "minilm_wic"
    trainer_out = tmp_path / "trainer_out"
    shutil.copytree(monitor, trainer_out / "monitor")
    (trainer_out / "trainer_state.json").write_text("{}")
    assert di.main([str(monitor), str(trainer_out), "--out", str(tmp_path / "o")]) == 0
    got = pd.read_csv(tmp_path / "o" / "dim_identity.csv")
    want = ol.dim_identity(monitor)
    for name in (str(monitor), str(trainer_out)):
        rows = got[got["history"] == name].drop(columns="history").reset_index(drop=True)
        assert rows["dim"].tolist() == want["dim"].tolist() == [63, 63, 63, 223, 223, 223, 63]
    assert "# Dimension identity" in (tmp_path / "o" / "dim_identity.md").read_text()
    assert di.main([str(monitor), str(SCHEMES), "--out", str(tmp_path / "x")]) == 2
    assert "not both in one call" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["dim_identity.csv", "dim_identity.md"])
def test_a_full_disk_leaves_no_table_cut_under_its_own_name(tmp_path, monkeypatch, name):
    from tests.disk_helpers import fill_disk_for

    fill_disk_for(monkeypatch, name)
    with pytest.raises(OSError, match="No space left"):
        di.main([str(ROOT / "docs" / "loop_monitors" / "minilm_wic"), "--out", str(tmp_path / "o")])
    monkeypatch.undo()
    assert not (tmp_path / "o" / name).exists() and not [p for p in (tmp_path / "o").iterdir() if "partial" in p.name]
