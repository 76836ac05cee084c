"""Every figure outlierlab writes is complete or absent: a kill or a full disk while matplotlib encodes leaves the
earlier file (or none), never a torn PNG under the final name.

The plotting functions are called for real; only ``Figure.savefig`` is replaced by one that writes half a PNG to
whatever it was given and then fails, as ``savefig(path)`` does when the disk fills mid-write.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from outlierlab.utils.atomic import save_figure

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BEFORE = PNG_MAGIC + b"the earlier, complete figure"


def _torn_savefig(fig, fname, *args, **kwargs):
    data = PNG_MAGIC + b"half a figure"
    if hasattr(fname, "write"):
        fname.write(data)
    else:
        with open(fname, "wb") as fh:
            fh.write(data)
    raise OSError(28, "No space left on device")


def _plot_frequent_tokens(path):
    from outlierlab.evaluation.analyses.frequent_tokens import _plot
    rows = [{"rule": "model", "condition": "full", "spearman": 0.5, "logprob_spearman": 0.2},
            {"rule": "3sigma", "condition": "zeroed", "spearman": 0.1, "logprob_spearman": float("nan")}]
    _plot(rows, path)


def _plot_qk(path):
    from outlierlab.evaluation.analyses.qk_outliers import _heatmap
    _heatmap({"q_max": torch.rand(2, 2, 4), "k_max": torch.rand(2, 2, 4)}, [None], path, "qk")


def _plot_frequency(path):
    from outlierlab.evaluation.analyses.frequency import _scatter
    table = SimpleNamespace(freqs=np.array([0, 3, 10, 100]), dims=[5], means=torch.rand(2, 4, 1),
                            rho=torch.rand(2, 1))
    _scatter(table, [1], {1: 5}, path, "mean value", "frequency")


def _plot_sinks(path):
    from outlierlab.evaluation.analyses.attention_sinks import _heatmap
    _heatmap({"full": {"bos": torch.rand(2, 3), "eos": torch.rand(2, 3)}}, path, "sinks")


def _plot_layers(path):
    from outlierlab.reports.evaluation_report import plot_layers
    plot_layers(path, {"a": [1.0, 2.0, 3.0]}, "value", "title", hline=1.5)


def _plot_vectors(path):
    from outlierlab.reports.evaluation_report import plot_vectors
    plot_vectors(path, [[0.1, -2.0, 0.3], [1.0, 0.0, 0.5]], ["layer 0", "layer 1"], marks=[[1], [0]], suptitle="s")


def _plot_reproduction(path, monkeypatch):
    from lab import reproduction_tables
    monkeypatch.setattr(sys, "argv", ["reproduction_tables", "runs", str(path.parent)])
    assert reproduction_tables.line_plot({"rope": ([0, 1], [0.5, 0.7])}, "step", "acc", path.name) == path


def _plot_palette(path):
    from outlierlab.studies.report import save_palette_png
    fig = Figure(figsize=(2, 2))
    fig.add_subplot().plot([0, 1], [1, 0])
    save_palette_png(fig, path)


SITES = {"frequent_tokens": _plot_frequent_tokens, "qk_outliers": _plot_qk, "frequency": _plot_frequency,
         "attention_sinks": _plot_sinks, "plot_layers": _plot_layers, "plot_vectors": _plot_vectors,
         "reproduction_tables": _plot_reproduction, "studies_palette": _plot_palette}


def _call(name, path, monkeypatch):
    if name == "reproduction_tables":
        SITES[name](path, monkeypatch)
    else:
        SITES[name](path)


@pytest.mark.parametrize("name", sorted(SITES))
def test_a_failing_savefig_leaves_the_earlier_figure_and_nothing_else(name, tmp_path, monkeypatch):
    path = tmp_path / "figure.png"
    path.write_bytes(BEFORE)
    monkeypatch.setattr(Figure, "savefig", _torn_savefig)
    with pytest.raises(OSError, match="No space left"):
        _call(name, path, monkeypatch)
    assert path.read_bytes() == BEFORE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.png"]  # no partial file beside it


@pytest.mark.parametrize("name", sorted(SITES))
def test_a_failing_savefig_leaves_no_file_where_there_was_none(name, tmp_path, monkeypatch):
    monkeypatch.setattr(Figure, "savefig", _torn_savefig)
    with pytest.raises(OSError):
        _call(name, tmp_path / "figure.png", monkeypatch)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", sorted(SITES))
def test_every_site_writes_a_whole_png(name, tmp_path, monkeypatch):
    from PIL import Image
    path = tmp_path / "figure.png"
    path.write_bytes(BEFORE)
    _call(name, path, monkeypatch)
    with Image.open(path) as im:
        im.load()  # decodes every row: a truncated PNG raises here
        assert im.format == "PNG" and im.size[0] > 10 and im.size[1] > 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.png"]


def test_save_figure_takes_the_format_from_the_suffix_unless_told(tmp_path):
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1])
    assert save_figure(fig, tmp_path / "a.pdf").read_bytes().startswith(b"%PDF")
    assert save_figure(fig, tmp_path / "b.svg").read_bytes().lstrip().startswith(b"<?xml")
    assert save_figure(fig, tmp_path / "c.png", dpi=20).read_bytes().startswith(PNG_MAGIC)
    assert save_figure(fig, tmp_path / "d.img", format="png").read_bytes().startswith(PNG_MAGIC)


def _savefig_calls(source: str) -> list[int]:
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "savefig"]


def test_the_scan_finds_a_savefig_call():
    # the check below must be able to fail: a file writing a figure in place is found, on whatever object
    assert _savefig_calls("fig.savefig(path, dpi=100)\nplt.savefig('a.png')\nx = 1\n") == [1, 2]
    assert _savefig_calls("save_figure(fig, path)\n") == []


def test_no_savefig_outside_the_atomic_helper():
    """``savefig`` writes as it encodes; outlierlab calls it only in ``utils/atomic.py`` (to memory), every figure
    goes through ``save_figure`` / ``figure_bytes``."""
    helper = ROOT / "outlierlab" / "utils" / "atomic.py"
    found = []
    for f in sorted((ROOT / "outlierlab").rglob("*.py")):
        if f == helper:
            continue
        found += [f"{f.relative_to(ROOT)}:{line}" for line in _savefig_calls(f.read_text(encoding="utf-8"))]
    assert found == [], f"write figures with outlierlab.utils.atomic.save_figure, not savefig: {found}"
    assert _savefig_calls(helper.read_text(encoding="utf-8"))  # the helper itself still encodes with savefig
