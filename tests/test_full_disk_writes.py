"""Files written whole or not at all (:func:`outlierlab.utils.atomic.write_atomic`): a disk that fills up while
one is written leaves the earlier file as it was and no temporary file beside it -- not a file cut short under its
own name that the next reader takes for complete (a run's config.yaml, a sweep's outcome, a probe report, a
monitor figure, a rewritten docs page)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.disk_helpers import fill_disk_for

EARLIER = "the earlier file, complete\n"


def _litter(folder) -> list[str]:
    return [p.name for p in folder.iterdir() if "partial" in p.name or ".tmp" in p.name]


def test_a_monitor_figure_is_synced_before_its_rename_and_a_full_disk_leaves_the_earlier_one(tmp_path, monkeypatch):
    """The figure's bytes reach the disk before the rename (a crash after a rename of unsynced data can leave an
    empty file under the figure's name), as every other atomic write of the project."""
    import os

    from outlierlab.monitoring.monitor_plots import save_png

    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    save_png(image, tmp_path / "mean_vector.png")
    monkeypatch.undo()
    assert calls[:2] == ["fsync", "replace"]
    earlier = (tmp_path / "mean_vector.png").read_bytes()
    fill_disk_for(monkeypatch, "mean_vector", left=100)
    with pytest.raises(OSError, match="No space left"):
        save_png(image[::-1].copy(), tmp_path / "mean_vector.png")
    monkeypatch.undo()
    assert (tmp_path / "mean_vector.png").read_bytes() == earlier and _litter(tmp_path) == []


def test_a_full_disk_leaves_the_earlier_probe_report(tmp_path, monkeypatch):
    from outlierlab.reports.probe_report import write_markdown

    row = {"layer": 0, "transform": "none", "accuracy": 0.5, "val_accuracy": 0.5, "top_neurons": "1;2",
           "outlier_dims": "", "outlier_rank": "", "contribution_outlier": 0.1, "contribution_mean": 0.1,
           "n_train": 10, "n_val": 5, "n_test": 5, "chance": 0.2, "dropped_tokens": 0, "truncated_sequences": 0}
    report = tmp_path / "probe_report.md"
    report.write_text(EARLIER)
    fill_disk_for(monkeypatch, "probe_report.md", left=100)
    with pytest.raises(OSError, match="No space left"):
        write_markdown([row], {"task": "position"}, report, "Position probe")
    monkeypatch.undo()
    assert report.read_text() == EARLIER and _litter(tmp_path) == []
    assert write_markdown([row], {"task": "position"}, report, "Position probe").read_text().startswith(
        "# Position probe\n")


def test_a_full_disk_leaves_no_torn_sweep_outcome(tmp_path, monkeypatch):
    """read() skips a torn outcome, so a failed cell cut short was left out of the sweep's failures; written
    whole or not at all, the full disk is an error where it happens."""
    from outlierlab.jobs import sweep_outcomes

    monkeypatch.setenv(sweep_outcomes.ENV, "launch1")
    sweep_outcomes.record(tmp_path / "0", "failed", "error one", sweep_dir=tmp_path)
    fill_disk_for(monkeypatch, ".json", left=20)
    with pytest.raises(OSError, match="No space left"):
        sweep_outcomes.record(tmp_path / "1", "failed", "error two: " + "x" * 200, sweep_dir=tmp_path)
    monkeypatch.undo()
    folder = tmp_path / sweep_outcomes.OUTCOMES / "launch1"
    assert [json.loads(p.read_text())["cell"] for p in folder.iterdir()] == [str(tmp_path / "0")]
    assert sweep_outcomes.read(tmp_path, "launch1") == [{"cell": str(tmp_path / "0"), "kind": "failed",
                                                         "error": "error one"}]


def test_a_full_disk_leaves_the_docs_page_the_tables_are_rendered_into(tmp_path, monkeypatch):
    from lab import doc_tables

    doc = tmp_path / "page.md"
    stale = "# Hand-written\n\n<!-- generated: emergence_seeds -->\nold\n<!-- end generated -->\n\nHand-written end.\n"
    doc.write_text(stale)
    fill_disk_for(monkeypatch, "page.md", left=50)
    with pytest.raises(OSError, match="No space left"):
        doc_tables.main([str(doc)])
    monkeypatch.undo()
    assert doc.read_text() == stale and _litter(tmp_path) == []
    assert doc_tables.main([str(doc)]) == 0 and doc.read_text().endswith("Hand-written end.\n")


def test_a_full_disk_leaves_the_earlier_emergence_grid(tmp_path, monkeypatch):
    import csv

    from lab import emergence_tables

    table = tmp_path / "switches.csv"
    cols = [c for c, _, _ in emergence_tables.GRID_METRICS]
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, ["run", "step", *cols])
        w.writeheader()
        w.writerow({"run": "learned_softmax", "step": 399, **{c: 1.0 for c in cols}})
    out = tmp_path / "grid.md"
    out.write_text(EARLIER)
    fill_disk_for(monkeypatch, "grid.md", left=50)
    with pytest.raises(OSError, match="No space left"):
        emergence_tables.main(["grid", "--table", str(table), "--out", str(out)])
    monkeypatch.undo()
    assert out.read_text() == EARLIER and _litter(tmp_path) == []


def test_a_full_disk_leaves_a_runs_earlier_config_yaml(tmp_path, shared_cache, monkeypatch):
    """The resolved config of a run (read back by the model card, post-hoc monitors and export) was cut short
    under its own name when the disk filled as train.py wrote it."""
    from outlierlab.jobs.training import train
    from tests.run_fixtures import small_cfg

    (tmp_path / "config.yaml").write_text(EARLIER)
    cfg = small_cfg(tmp_path, "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1")
    fill_disk_for(monkeypatch, "config.yaml", left=200)
    with pytest.raises(OSError, match="No space left"):
        train(cfg)
    monkeypatch.undo()
    assert (tmp_path / "config.yaml").read_text() == EARLIER and _litter(tmp_path) == []
    assert "no space left" in json.loads((tmp_path / "failed.json").read_text())["error"]
