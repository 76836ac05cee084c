"""lab.objectives_report on planted cells: the papers' contrasts equal hand/scipy values."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from outlierlab.jobs.run_state import mark_finished
from lab import objectives_report as report

LOSS = {("mlm", "learned"): [5.0, 5.2, 5.1], ("mlm", "none"): [5.6, 5.9, 5.7],
        ("clm", "learned"): [4.0, 4.1, 4.3], ("clm", "none"): [4.05, 4.2, 4.3]}
ACC = {("mlm", "none"): [0.05, 0.06, 0.04], ("clm", "none"): [0.30, 0.45, 0.41],
       ("mlm", "learned"): [0.9, 0.9, 0.9], ("clm", "learned"): [0.95, 0.9, 0.92]}


def plant(root, objective, pos, seed, i):
    cell = root / f"objective={objective},pos={pos},seed={seed}"
    (cell / ".hydra").mkdir(parents=True)
    (cell / ".hydra" / "overrides.yaml").write_text(f"- objective={objective}\n- pos={pos}\n- seed={seed}\n")
    (cell / "config.yaml").write_text(f"objective: {objective}\nseed: {seed}\npos:\n  name: {pos}\n"
                                      "trainer:\n  max_steps: 4000\n")
    (cell / "csv").mkdir()
    loss = LOSS[objective, pos][i]
    (cell / "csv" / "metrics.csv").write_text(f"step,val/loss,val/ppl\n3999,{loss},{math.exp(loss)}\n")
    (cell / "probe_posthoc").mkdir()
    acc = ACC[objective, pos][i]
    rows = ["step,layer,transform,accuracy,mean_abs_error"]
    rows += [f"{step},{layer},none,{acc if step else acc / 2},{10 - 10 * acc}" for step in (0, 4000) for layer in (0, 4)]
    (cell / "probe_posthoc" / "position_probe.csv").write_text("\n".join(rows) + "\n")
    sims = ["step,layer,distance,cosine,n_pairs"]
    sims += [f"{step},{layer},{d},{0.5 - (0.01 * d if objective == 'clm' else 0)},100"
             for step in (0, 4000) for layer in (0, 4) for d in (1, 8)]
    (cell / "probe_posthoc" / "similarity_by_distance.csv").write_text("\n".join(sims) + "\n")
    mark_finished(cell, 4000, 4000, {"val/loss": loss}, None)


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    for (objective, pos) in LOSS:
        for i, seed in enumerate((1, 2, 3)):
            plant(root, objective, pos, seed, i)
    return root


def test_haviv_interaction_and_probe_contrasts(sweep, tmp_path):
    assert report.main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    table = pd.read_csv(tmp_path / "out" / "objectives.csv")
    inter = table[table.quantity.str.startswith("val loss: (none - learned)")].iloc[0]
    d = [(LOSS["clm", "none"][i] - LOSS["clm", "learned"][i]) - (LOSS["mlm", "none"][i] - LOSS["mlm", "learned"][i])
         for i in range(3)]
    assert inter["diff"] == pytest.approx(sum(d) / 3)
    assert inter["p"] == pytest.approx(stats.ttest_1samp(d, 0).pvalue)
    assert bool(inter["primary"]) and inter["mde_80"] > 0
    acc = table[table.quantity == "probe accuracy, layer 4, step 4000"].iloc[0]
    assert acc["diff"] == pytest.approx(sum(a - b for a, b in zip(ACC["clm", "none"], ACC["mlm", "none"])) / 3)
    assert acc["p"] == pytest.approx(stats.ttest_rel(ACC["clm", "none"], ACC["mlm", "none"]).pvalue)
    prim = table[table.primary]
    assert len(prim) == 3  # interaction + last-layer accuracy at step 0 and trained
    holm = sorted(prim.p)
    assert prim.p_holm.min() == pytest.approx(min(1.0, 3 * holm[0]))
    # every other row: BH within its own question, so the loss rows never share a family with another question's
    from outlierlab.studies.study_inference import adjust_pvalues
    for family, sub in table[~table.primary].groupby("family"):
        assert family.startswith("exploratory: ") and set(sub.question) == {family.split(": ", 1)[1]}
        ok = sub.p.notna()
        assert sub.q_bh[ok].to_numpy() == pytest.approx(adjust_pvalues(sub.p[ok].to_numpy(), "fdr_bh"))
    zuo = table[table.quantity == "cos(d=1) - cos(d=8), layer 4, step 0"].iloc[0]
    assert zuo["diff"] == pytest.approx(0.07) and zuo["note"] == "constant across seeds"
    doc = (tmp_path / "out" / "objectives.md").read_text()
    assert "| clm | none | 3 |" in doc and "| clm | none | 4000 | 0.387 (6.1) | 0.387 (6.1) |" in doc


def test_cells_exported_to_two_folders_give_the_one_folder_table(sweep, tmp_path):
    assert report.main([str(sweep), "--out", str(tmp_path / "one")]) == 0
    causal = tmp_path / "causal"
    causal.mkdir()
    for cell in sweep.glob("objective=clm,*"):
        cell.rename(causal / cell.name)
    assert report.main([str(sweep), str(causal), "--out", str(tmp_path / "two")]) == 0
    one, two = (pd.read_csv(tmp_path / d / "objectives.csv") for d in ("one", "two"))
    pd.testing.assert_frame_equal(one, two)
    assert report.main([str(sweep), "--out", str(tmp_path / "masked_only")]) == 0  # the interaction needs both
    assert not pd.read_csv(tmp_path / "masked_only" / "objectives.csv").quantity.str.startswith(
        "val loss: (none - learned)").any()


def test_a_torn_cell_is_named_and_excluded(sweep, tmp_path):
    cell = sweep / "objective=clm,pos=none,seed=3"
    (cell / "csv" / "metrics.csv").write_text("step,val/loss,val/ppl\n3999,4.3,7")  # cut mid-row
    assert report.main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    doc = (tmp_path / "out" / "objectives.md").read_text()
    assert "excluded: objective=clm,pos=none,seed=3" in doc and "| clm | none | 2 |" in doc


def test_doc_tables_renders_the_objectives_block(sweep, monkeypatch):
    from lab import doc_table_reads, doc_tables

    monkeypatch.setattr(doc_table_reads, "ROOT", sweep.parent)
    monkeypatch.setattr(doc_tables, "OBJECTIVES", sweep.name)
    text = doc_tables.render("<!-- generated: objectives -->\nold\n<!-- end generated -->\n")
    assert "| mlm | none | 3 |" in text and "\nold\n" not in text


def test_fresh_monitor_histories_with_per_dimension_rows_are_read(tmp_path):
    """The live LayerNorm monitor writes top_gain_z / top_bias_z once per top dim: vectors, not scalars to average
    (a fresh sweep -- not an exported one, whose histories are cut to scalars -- failed on them)."""
    from outlierlab.studies.cells import cell_numbers, read_cell

    plant(tmp_path, "mlm", "none", 1, 0)
    cell = tmp_path / "objective=mlm,pos=none,seed=1"
    (cell / "monitor").mkdir()
    (cell / "monitor" / "layernorm.csv").write_text(
        "step,name,statistic,dim,value\n10,embeddings,top_gain_z,3,4.1\n10,embeddings,top_gain_z,7,3.2\n"
        "10,embeddings,top_bias_z,1,2.0\n10,embeddings,top_bias_z,2,1.5\n10,embeddings,n_gain_outliers,,2\n")
    nums = cell_numbers(read_cell(cell))
    assert set(nums[nums.metric.str.startswith("layernorm/")].metric) == {"layernorm/n_gain_outliers"}


def test_until_compares_cells_cut_by_the_clock_at_the_last_step_every_cell_reached(sweep, tmp_path):
    """A clm cell stopped at step 3,000 (no finished.json) is excluded by default; with --until 3000 it counts and
    every cell's loss is read at its last validation up to 3,000 (not the finished cells' 4,000): these files log
    validations the old way, at Lightning's batch counter (2,999 for the model after 3,000 updates), which the
    readers put at the model's step."""
    for cell in sweep.iterdir():
        rows = "step,val/loss,val/ppl\n2999,{a},1\n3999,{b},1\n"
        i = int(cell.name[-1]) - 1
        objective, pos = cell.name.split(",")[0][10:], cell.name.split(",")[1][4:]
        (cell / "csv" / "metrics.csv").write_text(rows.format(a=LOSS[objective, pos][i] + 1, b=LOSS[objective, pos][i]))
        mark_finished(cell, 4000, 4000, {"val/loss": LOSS[objective, pos][i]}, None)  # the manifest of these files
    cut = sweep / "objective=clm,pos=none,seed=3"
    (cut / "finished.json").unlink()
    (cut / "manifest.json").unlink(missing_ok=True)
    (cut / "csv" / "metrics.csv").write_text(f"step,val/loss,val/ppl\n2999,{LOSS['clm', 'none'][2] + 1},1\n")
    assert report.main([str(sweep), "--out", str(tmp_path / "plain")]) == 0
    assert "excluded: objective=clm,pos=none,seed=3" in (tmp_path / "plain" / "objectives.md").read_text()
    assert report.main([str(sweep), "--out", str(tmp_path / "until"), "--until", "3000"]) == 0
    doc = (tmp_path / "until" / "objectives.md").read_text()
    assert "excluded" not in doc and "objective=clm,pos=none,seed=3: stopped at step 3000 of 4000" in doc
    table = pd.read_csv(tmp_path / "until" / "objectives.csv")
    inter = table[table.quantity.str.startswith("val loss: (none - learned)")].iloc[0]
    d = [(LOSS["clm", "none"][i] - LOSS["clm", "learned"][i]) - (LOSS["mlm", "none"][i] - LOSS["mlm", "learned"][i])
         for i in range(3)]  # every loss read one nat higher at step 3,000: the differences are unchanged
    assert inter["diff"] == pytest.approx(sum(d) / 3) and inter["n_pairs"] == 3
    assert not table.quantity.str.contains("step 4000").any()  # the probes' step-4,000 rows are after --until too
    clm = table[table.quantity == "val loss, clm"].iloc[0]
    assert clm["mean_b"] == pytest.approx(sum(LOSS["clm", "learned"]) / 3 + 1)


@pytest.mark.parametrize("name", ["objectives.csv", "objectives.md"])
def test_a_full_disk_leaves_no_table_cut_under_its_own_name(sweep, tmp_path, monkeypatch, name):
    from tests.disk_helpers import fill_disk_for

    fill_disk_for(monkeypatch, name, left=100)
    with pytest.raises(OSError, match="No space left"):
        report.main([str(sweep), "--out", str(tmp_path / "o")])
    monkeypatch.undo()
    assert not (tmp_path / "o" / name).exists() and not [p for p in (tmp_path / "o").iterdir() if "partial" in p.name]
