"""scripts/export_cells.py carries each cell's manifest, restricted to the exported files, and it still verifies."""

from __future__ import annotations

import importlib.util
import json

from outlierlab.jobs.run_state import finished_run, mark_finished, verify_manifest
from tests.conftest import ROOT


def _export_cells():
    spec = importlib.util.spec_from_file_location("export_cells", ROOT / "scripts" / "export_cells.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plant(cell):
    (cell / "csv").mkdir(parents=True)
    (cell / "csv" / "metrics.csv").write_text("step,val/ppl\n1000,329.7\n")
    (cell / "monitor").mkdir()
    (cell / "monitor" / "hidden_states.csv").write_text(
        "step,name,statistic,dim,value\n0,layer.3,kurtosis,,1.5\n0,layer.3,mean,0,0.1\n0,layer.3,mean,1,0.2\n")
    (cell / "probe_posthoc").mkdir()
    (cell / "probe_posthoc" / "position_probe.csv").write_text("step,layer,accuracy\n0,1,0.1\n")
    (cell / "left_behind.csv").write_text("a\n1\n")
    mark_finished(cell, 1000, 1000, {"val/loss": 5.8}, {"seed": 1})


def test_exported_cell_keeps_a_manifest_that_verifies(tmp_path):
    cell = tmp_path / "sweep" / "pos=none,seed=1"
    _plant(cell)
    assert verify_manifest(cell) == [] and finished_run(cell)["global_step"] == 1000
    out = tmp_path / "out"
    assert _export_cells().export(tmp_path / "sweep", out) == ["pos=none,seed=1"]
    target = out / "pos=none,seed=1"
    manifest = json.loads((target / "manifest.json").read_text())
    assert verify_manifest(target) == []
    assert manifest["not_exported"] == ["left_behind.csv"]
    hist = manifest["files"]["monitor/hidden_states.csv"]
    assert hist["rows"] == 1 and hist["filtered_from"]["rows"] == 3  # per-dimension rows cut, original named
    assert (target / "probe_posthoc" / "position_probe.csv").is_file()
    # a later edit of an exported file is caught
    (target / "csv" / "metrics.csv").write_text("step,val/ppl\n1000,32\n")
    assert [p for p in verify_manifest(target) if "csv/metrics.csv" in p]


def test_export_into_a_table_keeps_its_cells_and_adds_the_new_ones(tmp_path):
    from outlierlab.studies.table import cells_dir

    export_cells = _export_cells()
    _plant(tmp_path / "sweep" / "pos=none,seed=1")
    table = tmp_path / "cells.parquet"
    assert export_cells.main([str(tmp_path / "sweep"), str(table)]) == 0
    _plant(tmp_path / "sweep2" / "pos=learned,seed=1")
    assert export_cells.export_table(tmp_path / "sweep2", table) == ["pos=learned,seed=1"]
    unpacked = cells_dir(table)
    assert sorted(p.name for p in unpacked.iterdir() if p.is_dir()) == ["pos=learned,seed=1", "pos=none,seed=1"]
    for cell in unpacked.iterdir():
        if cell.is_dir():
            assert verify_manifest(cell) == [], cell.name
    assert (unpacked / "pos=none,seed=1" / "csv" / "metrics.csv").read_text() == "step,val/ppl\n1000,329.7\n"
    assert export_cells.export_table(tmp_path / "sweep2", table) == []  # nothing new: the table is left as it was
