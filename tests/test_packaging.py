"""A regular (non-editable) install works from Python: the wheel carries configs/ inside the package (setup.py), so
``ol.evaluate`` composes the same configs and gives the same numbers as the repository's API, run from a directory
that is not the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# builds the wheel and installs it: the full suite's, not the fast tier's
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["The cat sat on the mat by the door.", "A dog ran across the park in the rain.",
         "Birds sing in the trees at dawn.", "She read the letter twice before she answered it."] * 10
SCRIPT = """
import json, sys
import outlierlab as ol
import outlierlab.configuration.overrides as overrides
enc = ol.load_encoder("all-minilm-l6-v2", device="cpu")
table = ol.evaluate(enc, json.loads(sys.argv[1]), analyses=["outliers"], transforms=["none", "clip"], seed=1,
                    out_dir=sys.argv[2], progress=False)["outliers"]
print(json.dumps({"package": ol.__file__, "configs": str(overrides.CONFIG_DIR),
                  "rows": table.to_dict(orient="records")}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built offline from a copy of what a clone holds (no build/ left in the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("outlierlab", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("outlierlab-*.whl")
    return whl


def test_the_wheel_carries_every_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"outlierlab/configs/{p.relative_to(ROOT / 'configs').as_posix()}"
               for p in (ROOT / "configs").rglob("*.yaml")}
    assert len(configs) > 50 and configs <= names
    assert not any(n.startswith("configs/") for n in names)  # no top-level "configs" package beside others'


def _run(pythonpath: str, cwd: Path, out_dir: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": pythonpath, "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(TEXTS), str(out_dir)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_api_of_an_installed_wheel_gives_the_repositorys_numbers(wheel, tmp_path):
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"  # not the repository: nothing can be found beside train.py
    elsewhere.mkdir()
    installed = _run(str(site), elsewhere, tmp_path / "installed")
    assert installed["package"] == str(site / "outlierlab" / "__init__.py")
    assert installed["configs"] == str(site / "outlierlab" / "configs")
    repo = _run(str(ROOT), ROOT, tmp_path / "repo")
    assert repo["configs"] == str(ROOT / "configs")
    assert len(installed["rows"]) == 14  # 7 hidden states x {none, clip}
    assert installed["rows"] == repo["rows"]
