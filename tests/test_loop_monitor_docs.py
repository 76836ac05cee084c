"""docs/loop_monitors.md's Hugging Face Trainer script runs as written offline -- its tokenizer a local one, nothing
fetched from a hub -- scaled down to a few steps, and leaves the monitor's files where the page says."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "loop_monitors.md"
#: the script's settings a test scales down (each must appear as written, so the test follows the page)
SCALED = {"max_steps=2000": "max_steps=4", "per_device_train_batch_size=32": "per_device_train_batch_size=4",
          "every_n_steps=50)": "every_n_steps=2)", "warmup_steps=100": "warmup_steps=1"}


def trainer_script() -> str:
    section = PAGE.read_text(encoding="utf-8").split("## Hugging Face Trainer", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_trainer_script_names_no_hub_model():
    script = trainer_script()
    assert "from_pretrained(bundled_model_path())" in script
    assert not re.findall(r"from_pretrained\(\"[^\"]*/", script), "a hub id: the page's script must run offline"


@pytest.mark.slow
def test_the_trainer_script_runs_offline_as_written(tmp_path):
    script = trainer_script()
    for written, scaled in SCALED.items():
        assert script.count(written) == 1, written
        script = script.replace(written, scaled)
    (tmp_path / "run_mlm_monitored.py").write_text(script)
    corpus = ROOT / "outlierlab" / "datamodules" / "data" / "corpus" / "austen_emma.txt.gz"
    lines = [line for line in gzip.open(corpus, "rt", encoding="utf-8").read().splitlines() if line.strip()][:200]
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    # no hub, and an empty Hugging Face home: nothing cached elsewhere can stand in for a download
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "run_mlm_monitored.py", "train.txt", "out"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    monitor = tmp_path / "out" / "monitor"
    hidden = (monitor / "hidden_states.csv").read_text()
    assert {"0", "2", "4"} <= {row.split(",")[0] for row in hidden.splitlines()[1:]}
    assert (monitor / "layernorm.csv").exists()
    assert list((tmp_path / "out" / "runs").rglob("outlier_monitor/events.out.tfevents.*"))
