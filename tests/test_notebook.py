"""The example notebook runs top to bottom, offline, and its tables are the API's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    # the kernel imports this checkout's outlierlab, not whichever one the environment's install points at
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "examples" / "quickstart.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = {i: "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in c.get("outputs", []))
               for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    assert not [c for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert "(6, 384)" in outputs[1]                 # MiniLM: 6 layers, 384 dims
    assert "whiten" in outputs[4] and "clip" in outputs[4]
    assert "accuracy" in outputs[7]
    # order use of a model without an LM head: every layer's sentence-vector order change, 7 rows (0-6), the
    # embedding output at the LayerNorm floor and the last layer well above it (docs/order_use.md: 0.0001, 0.167)
    order = next(o.data["text/plain"] for o in nb.cells[9].outputs if o.output_type == "execute_result").split("\n")
    change = [float(line.split()[-1]) for line in order[1:]]
    assert len(change) == 7 and change[0] < 0.01 < change[6] < 1
    # the notebook's own analysis on the shared stream: one row per layer (0-6), a column per transform, and every
    # share a fraction in [1/384, 1] (the largest of 384 squared coordinates over their sum)
    table = next(o.data["text/plain"] for o in nb.cells[11].outputs if o.output_type == "execute_result").split("\n")
    assert "none" in table[0] and "whiten" in table[0]
    values = [float(v) for line in table[2:] for v in line.split()[1:]]
    assert [line.split()[0] for line in table[2:]] == [str(i) for i in range(7)] and len(values) == 14
    assert all(1 / 384 <= v <= 1 for v in values)
    # named sites: the scheme's first names, and a last-layer dimension holding a share of the tokens in (0, 1]
    sites = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "run_with_cache" in c.source)
    assert "['embed', 'ln_embed', 'blocks.1.attn.in', 'blocks.1.attn.q'" in outputs[sites]
    share = float(outputs[sites].split(" holds the largest |value| of ")[1].split()[0])
    assert 0 < share <= 1


def test_the_committed_notebook_carries_its_outputs():
    """The docs site shows the notebook as committed (mkdocs-jupyter does not execute it): every code cell ran, in
    order, in one kernel, and kept what it printed, with no error and no traceback."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(ROOT / "examples" / "quickstart.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        "run the notebook top to bottom: jupyter nbconvert --to notebook --execute --inplace examples/quickstart.ipynb"
    assert all(c.outputs for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
