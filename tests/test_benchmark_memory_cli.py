"""benchmarks/evaluate_memory.py without running a benchmark: its refusals and the arithmetic of its report."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "evaluate_memory.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("evaluate_memory_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_save_dir_holding_another_shape_is_refused_in_one_line(bench, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 1024, "num_hidden_layers": 8, "intermediate_size": 2816, "vocab_size": 32000}))
    bench.check_saved_shape(tmp_path, "1024,8,2816,32000")  # the same shape: reused
    with pytest.raises(SystemExit) as e:
        bench.check_saved_shape(tmp_path, "4096,32,11008,32000")
    msg = str(e.value.code)
    assert "\n" not in msg and "1024,8,2816,32000" in msg and "--llama 4096,32,11008,32000" in msg
