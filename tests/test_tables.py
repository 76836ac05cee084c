"""outlierlab.utils.tables: the one row-CSV writer and the one Markdown table (expected text written by hand)."""

from __future__ import annotations

import math

from outlierlab.utils.tables import columns_of, joined, md_table, write_csv


def test_write_csv_header_order_missing_cells_and_csv_dialect(tmp_path):
    rows = [{"b": 1.5, "a": "x,y"}, {"a": None, "c": 0.1 + 0.2}]
    path = write_csv(tmp_path / "t.csv", rows)
    # columns in first-seen order; None and a missing key are empty; floats are str(); \r\n line ends
    assert path.read_bytes() == b'b,a,c\r\n1.5,"x,y",\r\n,,0.30000000000000004\r\n'
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]  # the temporary file was renamed over it


def test_write_csv_fixed_columns_drop_extras_and_an_empty_table_keeps_its_header(tmp_path):
    path = write_csv(tmp_path / "t.csv", [{"step": 3, "layer": "layer_1", "extra": 9}], ["layer", "step"])
    assert path.read_bytes().decode() == "layer,step\r\nlayer_1,3\r\n"
    assert write_csv(tmp_path / "e.csv", [], ["step", "layer"]).read_bytes().decode() == "step,layer\r\n"


def test_write_csv_cell_maps_every_value(tmp_path):
    path = write_csv(tmp_path / "t.csv", [{"dims": [588, 77], "pair": (1, 2), "n": 3}], cell=joined)
    assert path.read_bytes().decode() == "dims,pair,n\r\n588;77,1;2,3\r\n"
    plain = write_csv(tmp_path / "p.csv", [{"dims": [588, 77]}])
    assert plain.read_bytes().decode() == 'dims\r\n"[588, 77]"\r\n'


def test_columns_of_puts_the_given_columns_first():
    rows = [{"x": 1, "transform": "none"}, {"layer": 0, "y": 2}]
    assert columns_of(rows, ("layer", "transform", "dataset")) == ["layer", "transform", "x", "y"]
    assert columns_of(rows) == ["x", "transform", "layer", "y"]


def test_md_table_default_cells_round_floats_and_show_nan_as_a_dash():
    text = md_table(["layer", "score"], [[0, 0.12345], [1, math.nan], ["all", "n/a"]])
    assert text == ("| layer | score |\n"
                    "|---|---|\n"
                    "| 0 | 0.123 |\n"
                    "| 1 | – |\n"
                    "| all | n/a |")


def test_md_table_digits_of_the_default_cells():
    assert md_table(["accuracy %"], [[87.25], [100]], 1) == "| accuracy % |\n|---|\n| 87.2 |\n| 100 |"


def test_md_table_with_its_own_cell_format():
    assert md_table(["a"], [[0.5]], cell=str) == "| a |\n|---|\n| 0.5 |"
    assert md_table(["a", "b"], [], cell=lambda v: f"{v:.1f}") == "| a | b |\n|---|---|"
