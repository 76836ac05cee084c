"""Published checkpoint series as studies: the step/seed read from a revision or a model name, and
``evaluate.py -m encoder.revision=...`` aggregated by ``outlierlab.studies.aggregate`` into one curve over steps.

The "hub" is a local Hugging Face cache holding tiny models under revisions step0/step1000/step2000, read
offline exactly as ``EleutherAI/pythia-160m`` at ``step1000`` would be.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from outlierlab.jobs.series import SeriesPoint, apply_series, series_point

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize("key,value,expected", [
    ("encoder.revision", "step0", SeriesPoint("step*", None, 0)),
    ("encoder.revision", "step143000", SeriesPoint("step*", None, 143000)),
    ("encoder.revision", "step20000-tokens84B", SeriesPoint("step*", None, 20000)),  # OLMo
    ("encoder.revision", "main", SeriesPoint("main")),
    ("encoder.revision", "stepwise", SeriesPoint("stepwise")),
    ("encoder.name_or_path", "google/multiberts-seed_3", SeriesPoint("google/multiberts-seed_*", 3, None)),
    ("encoder.name_or_path", "google/multiberts-seed_12-step_1500k",
     SeriesPoint("google/multiberts-seed_*-step_*k", 12, 1_500_000)),
    ("encoder.name_or_path", "/ckpts/pythia/step4000", SeriesPoint("/ckpts/pythia/step*", None, 4000)),
    ("encoder.name_or_path", "/ckpts/run/step_20k/", SeriesPoint("/ckpts/run/step*", None, 20000)),
    ("encoder.name_or_path", "EleutherAI/pythia-160m", SeriesPoint("EleutherAI/pythia-160m")),
    ("seed", "step1000", SeriesPoint("step1000")),  # other keys pass unchanged
])
def test_series_point(key, value, expected):
    assert series_point(key, value) == expected


def test_apply_series_rewrites_identity_and_config():
    ov = {"encoder.name_or_path": "google/multiberts-seed_2-step_40k", "analyses": "[outliers]"}
    cfg = {"encoder.name_or_path": "google/multiberts-seed_2-step_40k", "seed": 0}
    assert apply_series(ov, cfg) == (2, 40000)
    assert ov["encoder.name_or_path"] == cfg["encoder.name_or_path"] == "google/multiberts-seed_*-step_*k"
    with pytest.raises(ValueError, match="different steps"):
        apply_series({"encoder.revision": "step1", "encoder.name_or_path": "/x/step2"}, {})


@pytest.mark.slow
def test_revision_sweep_is_one_curve_over_steps(tmp_path):
    from outlierlab.studies.aggregate import run as study
    from probe_fixtures import SENTENCES, save_tiny_bert
    from llama_fixtures import fake_hub

    cache = tmp_path / "hub"
    fake_hub(cache, "org/tiny", {f"step{s}": save_tiny_bert(tmp_path / f"m{s}", seed=i)
                                 for i, s in enumerate((0, 1000, 2000))})
    texts = [f"{s} and then {t}" for s in SENTENCES for t in SENTENCES[:4]]
    (tmp_path / "s.txt").write_text("\n".join(texts) + "\n")
    sweep = tmp_path / "sweep"
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "evaluate.py", "-m", "encoder.name_or_path=org/tiny",
                        "encoder.revision=step0,step1000,step2000", "analyses=[outliers,anisotropy]", "transform=[none]",
                        f"data.files=[{tmp_path / 's.txt'}]", "encoder.device=cpu", "progress=false",
                        "tensorboard=false", f"hydra.sweep.dir={sweep}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    res = study([str(sweep)], plots=True)
    assert res["groups"] == {next(iter(res["groups"])): 3}  # ONE group of three checkpoints
    table = list(csv.DictReader(open(res["out"] / "study.csv")))
    rows = [r for r in table if r["metric"] == "anisotropy/none/anisotropy" and r["layer"] == "layer_1"]
    assert sorted(int(r["step"]) for r in rows) == [0, 1000, 2000]
    # each step's value is that checkpoint's own anisotropy.csv row (n = 1 per step)
    for cell in sorted(c for c in sweep.iterdir() if (c / "anisotropy.csv").is_file()):
        rev = next(line.split("=")[1] for line in (cell / ".hydra/overrides.yaml").read_text().split("\n")
                   if "encoder.revision" in line).strip()
        own = next(r for r in csv.DictReader(open(cell / "anisotropy.csv"))
                   if r["layer"] == "1" and r["transform"] == "none")
        got = next(r for r in rows if int(r["step"]) == int(rev[4:]))
        assert int(got["n"]) == 1 and float(got["mean"]) == pytest.approx(float(own["anisotropy"]), rel=1e-6)
    assert len({float(r["mean"]) for r in rows}) == 3  # three different models, three values
