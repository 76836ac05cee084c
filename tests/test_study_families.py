"""Declared families: a planted outlier effect keeps its corrected p-value however many trivially significant loss
rows a study also logs, loss never shares a family with an outlier measure, study.md's family sizes are the CSV's,
and pairs match on the seed each run used."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from outlierlab.studies.study_inference import adjust_pvalues
from outlierlab.studies import aggregate as study
from outlierlab.studies.design import is_performance
from tests.study_fixtures import row

SEEDS = (1, 2, 3, 4, 5)
STEPS = list(range(0, 101, 10))  # monitor rows every 10 steps; the last step is 100
# the planted effect: learned - none kurtosis at layer_2 (also the most concentrated layer) at the last step, one
# per-seed difference each, spread so that the paired t-test gives a moderate p (about 0.01)
PLANTED = {1: 0.9, 2: 0.3, 3: 1.5, 4: 0.6, 5: 1.2}


def plant(root: Path, name: str, overrides: dict, seed: int, pos: str, loss_rows: bool, monitor: bool = True) -> Path:
    """A finished train.py-like cell: kurtosis at layers 1-2 and argmax share at layer 2 every 10 steps, and --
    with ``loss_rows`` -- val/loss and val/acc at every step, the learned model far better in every seed."""
    rng = np.random.default_rng(1000 * seed + (pos == "learned"))
    cell = root / name
    (cell / ".hydra").mkdir(parents=True)
    (cell / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"{k}={v}" for k, v in overrides.items()]))
    (cell / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "pos": {"name": pos},
                                                      "trainer": {"max_steps": STEPS[-1]}}))
    hist = ["step,name,statistic,dim,value"]
    for step in STEPS:
        base = 2.0 + 0.01 * step + rng.normal(0, 0.3)
        k2 = base + (PLANTED.get(seed, 1.0) if (pos == "learned" and step == STEPS[-1]) else 0.0)
        hist += [f"{step},layer_1,kurtosis,,{base / 4 + rng.normal(0, 0.05)}", f"{step},layer_2,kurtosis,,{k2}",
                 f"{step},layer_2,argmax_share,3,{0.3 + rng.normal(0, 0.02)}"]
    if monitor:
        (cell / "monitor").mkdir()
        (cell / "monitor" / "hidden_states.csv").write_text("\n".join(hist) + "\n")
    lines = ["epoch,step,val/loss,val/acc"]
    if loss_rows:
        for step in range(1, STEPS[-1]):
            gap = 2.0 if pos == "learned" else 0.0
            lines.append(f"0,{step},{6.0 - gap + rng.normal(0, 0.01)},{0.1 + gap / 10 + rng.normal(0, 0.001)}")
    if loss_rows:
        (cell / "csv").mkdir()
        (cell / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")
    (cell / "finished.json").write_text(json.dumps({"global_step": STEPS[-1], "max_steps": STEPS[-1]}))
    return cell


def plant_study(root: Path, loss_rows: bool) -> Path:
    for pos in ("learned", "none"):
        for seed in SEEDS:
            plant(root, f"pos={pos},seed={seed}", {"pos": pos, "seed": seed}, seed, pos, loss_rows)
    return root


def _contrasts(tmp_path: Path, name: str, loss_rows: bool, **kw) -> tuple[pd.DataFrame, str]:
    res = study.run([str(plant_study(tmp_path / name, loss_rows))], contrasts=["pos=learned,none"], plots=False, **kw)
    return pd.read_csv(res["out"] / "contrasts.csv"), (res["out"] / "study.md").read_text()


@pytest.mark.slow
def test_a_planted_effects_q_does_not_depend_on_how_many_loss_rows_the_study_logs(tmp_path):
    """The default confirmatory family (nothing declared): the outlier measures at the last step.  Adding 99 steps
    of val/loss and val/acc that differ with p ~ 1e-9 leaves the planted metric's Holm p and BH q unchanged -- in
    the primary family and in the exploratory one -- as it could not when every non-primary row shared one BH."""
    lean, _ = _contrasts(tmp_path, "lean", loss_rows=False)
    padded, _ = _contrasts(tmp_path, "padded", loss_rows=True)
    trivial = padded[padded["metric"].map(is_performance)]
    assert len(trivial) >= 190 and (trivial["p_value"] < 1e-6).mean() > 0.9  # the padding is what it should be
    for where in ({"step": 100, "layer": "max_layer", "metric": "hidden/kurtosis"},
                  {"step": 100, "layer": "layer_2", "metric": "hidden/kurtosis"}):
        a, b = row(lean, **where), row(padded, **where)
        assert a["p_value"] == pytest.approx(b["p_value"]) and 1e-3 < a["p_value"] < 0.05
        assert a["family"] == b["family"] and a["q_bh"] == pytest.approx(b["q_bh"], rel=1e-12)
        assert (a["p_holm"] == pytest.approx(b["p_holm"], rel=1e-12)) if a["family"] == "primary" else True
    assert row(lean, step=100, layer="max_layer", metric="hidden/kurtosis")["family"] == "primary"
    assert row(lean, step=100, layer="layer_2", metric="hidden/kurtosis")["family"] == "exploratory"
    # by hand: Holm over the primary family's raw p-values (kurtosis and argmax share at max_layer)
    prim = lean[lean["family"] == "primary"].sort_values("metric")
    assert list(prim["metric"]) == ["hidden/argmax_share", "hidden/kurtosis"]
    assert prim["p_holm"].to_numpy() == pytest.approx(adjust_pvalues(prim["p_value"].to_numpy(), "holm"))
    # loss and accuracy: their own exploratory family, never an outlier claim's
    assert set(padded.loc[padded["metric"].map(is_performance), "family"]) <= {"exploratory performance", "not tested"}
    assert not padded.loc[padded["family"].isin(["primary", "exploratory"]), "metric"].map(is_performance).any()


def test_per_step_rows_are_exploratory_curves(tmp_path):
    c, _ = _contrasts(tmp_path, "s", loss_rows=True)
    early = c[(c["step"] < 100) & c["family"].isin(["primary", "performance"])]
    assert early.empty and set(c.loc[c["step"] < 99, "family"]) <= {"exploratory", "exploratory performance",
                                                                     "not tested"}


@pytest.mark.slow
def test_study_md_states_each_familys_size_and_rule(tmp_path):
    """Declared val/loss goes to the performance family (at its last step, 100: the validation after 100 updates,
    logged at 99 by Lightning's batch counter, read at the monitors' step), the declared outlier measures to the
    primary one; study.md's sizes are the CSV's counts."""
    c, md = _contrasts(tmp_path, "d", loss_rows=True,
                       primary=["hidden/kurtosis@layer_2", "hidden/kurtosis@layer_1", "val/loss@model"])
    counts = c["family"].value_counts()
    sizes = {name: int(n) for name, n in re.findall(r"\*\*([a-z ]+?)(?: \(outlier claims\))?: (\d+) tests?\*\*", md)}
    assert sizes == {f: int(counts.get(f, 0)) for f in ("primary", "performance", "exploratory",
                                                       "exploratory performance")}
    assert sizes["primary"] == 2 and sizes["performance"] == 1
    perf = row(c, family="performance")
    assert (perf["metric"], perf["step"]) == ("val/loss", 100) and perf["p_holm"] == pytest.approx(perf["p_value"])
    assert "rule: declared (--primary), at the last step every cell reached" in md
    _, default_md = _contrasts(tmp_path, "e", loss_rows=False)
    assert "rule: the outlier measures at the last step every cell reached (no outlier measure declared)" in default_md
    assert "metrics: hidden/kurtosis@max_layer, hidden/argmax_share@max_layer;" in default_md


def test_cells_without_monitor_files_do_not_move_the_last_step(tmp_path):
    """Two learned cells logged validations only (last row: step 99, the model after 100 updates, read at 100): the
    outlier family stays at the monitors' step 100, over the three pairs that have it."""
    root = tmp_path / "mixed"
    for pos in ("learned", "none"):
        for seed in SEEDS:
            plant(root, f"pos={pos},seed={seed}", {"pos": pos, "seed": seed}, seed, pos, loss_rows=True,
                  monitor=not (pos == "learned" and seed > 3))
    res = study.run([str(root)], contrasts=["pos=learned,none"], plots=False, primary=["val/loss@model"])
    c = pd.read_csv(res["out"] / "contrasts.csv")
    r = row(c, family="primary", metric="hidden/kurtosis")
    assert r["step"] == 100 and r["n_pairs"] == 3
    assert row(c, family="performance")["step"] == 100


def test_pairs_match_on_the_seed_the_run_used_not_on_a_label(tmp_path):
    """Cells named 'seed1' whose configs say seed 42 (a run started without a seed override): paired on 42 and 2,
    and study.md lists those seeds."""
    root = tmp_path / "labels"
    for pos in ("learned", "none"):
        for label, seed in ((1, 42), (2, 2), (3, 3)):
            plant(root, f"{pos}_seed{label}", {"pos": pos}, seed, pos, loss_rows=False)
    res = study.run([str(root)], contrasts=["pos=learned,none"], plots=False)
    md = (res["out"] / "study.md").read_text()
    assert "| pos=learned | 2, 3, 42 |" in md
    r = row(pd.read_csv(res["out"] / "contrasts.csv"), step=100, layer="layer_2", metric="hidden/kurtosis")
    assert r["test"] == "paired t" and r["n_pairs"] == 3


def test_every_committed_study_states_the_family_sizes_of_its_contrasts():
    """docs/: each study.md's family sizes are its committed contrasts' counts, and no loss, accuracy, perplexity or
    order-use row is in an outlier family."""
    from tests.conftest import ROOT

    studies = [p.parent for p in sorted((ROOT / "docs").rglob("study.md")) if (p.parent / "contrasts.csv.xz").is_file()]
    assert len(studies) >= 10
    for folder in studies:
        md = (folder / "study.md").read_text()
        c = pd.read_csv(folder / "contrasts.csv.xz", usecols=["metric", "family"])
        # the committed contrasts keep the per-step curves in part; families.csv.xz counts the full table's rows
        counts = pd.read_csv(folder / "families.csv.xz").groupby("family")["rows"].sum()
        sizes = {n: int(k) for n, k in re.findall(r"\*\*([a-z ]+?)(?: \(outlier claims\))?: (\d+) tests?\*\*", md)}
        assert sizes == {f: int(counts.get(f, 0)) for f in ("primary", "performance", "exploratory",
                                                           "exploratory performance")}, folder
        assert not c.loc[c["family"].isin(["primary", "exploratory"]), "metric"].map(is_performance).any(), folder
