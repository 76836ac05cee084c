"""The seed-study aggregator on planted cells whose numbers are chosen by hand."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from outlierlab.studies.seed_statistics import contrast, summarize
from outlierlab.studies import aggregate as study
from tests.study_fixtures import LEARNED, NONE, plant_cell, plant_study, row

T_975_2 = 4.302652729911275  # scipy.stats.t.ppf(0.975, 2), as a constant: the test must not share the code's call



def test_summary_equals_hand_computed_mean_std_and_t_interval(tmp_path):
    plant_study(tmp_path)
    res = study.run([str(tmp_path)], contrasts=["pos=learned,none"], plots=True)
    df = pd.read_csv(res["out"] / "study.csv")
    r = row(df, group="pos=learned", step=100, layer="layer_2", metric="hidden/kurtosis")
    mean = 5.0  # (2 + 4 + 9) / 3
    std = math.sqrt(((2 - 5) ** 2 + (4 - 5) ** 2 + (9 - 5) ** 2) / 2)  # sqrt(13)
    # study.csv keeps 6 significant digits (study.CSV_FLOATS): ci_high = 13.9567 carries 1e-4 absolute
    assert r["n"] == 3 and r["mean"] == pytest.approx(mean) and r["std"] == pytest.approx(std, rel=1e-5)
    assert r["ci_high"] - r["mean"] == pytest.approx(T_975_2 * std / math.sqrt(3), abs=1e-4)
    assert r["min"] == 2.0 and r["max"] == 9.0 and r["seeds"] == "1 2 3"
    assert r["ci"] == "Student t, 95%"
    # max_layer is taken within each run (layer_2 = 2 x layer_1 here), then averaged
    assert row(df, group="pos=learned", step=100, layer="max_layer", metric="hidden/kurtosis")["mean"] == pytest.approx(5.0)
    # per-dimension vectors are not aggregated; the Lightning CSV gives val/ppl at layer "model"
    assert not (df["metric"] == "hidden/mean").any()
    assert row(df, group="pos=none", step=100, layer="model", metric="val/ppl")["mean"] == pytest.approx(302.0)
    assert not df["metric"].str.startswith("lr-").any()  # Lightning's bookkeeping is not a result
    md = (res["out"] / "study.md").read_text()
    assert "| pos=learned | 1, 2, 3 |" in md and "Contrast pos=learned,none" in md
    assert res["plots"] and all(p.is_file() for p in res["plots"])


def test_contrast_paired_over_common_seeds_and_ordering(tmp_path):
    plant_study(tmp_path)
    res = study.run([str(tmp_path)], contrasts=["pos=learned,none"], plots=False)
    c = pd.read_csv(res["out"] / "contrasts.csv")
    r = row(c, step=100, layer="layer_2", metric="hidden/kurtosis")
    d = [2 - 1, 4 - 1.5, 9 - 2]  # per-seed differences 1, 2.5, 7
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    assert r["test"] == "paired t" and r["diff"] == pytest.approx(mean)
    assert r["ci_low"] == pytest.approx(mean - T_975_2 * sd / math.sqrt(3), rel=1e-6)
    assert bool(r["same_order_every_seed"]) and r["ordering"] == "3/3 seeds a > b"


def test_contrast_whose_seeds_disagree_in_sign_is_reported_as_such():
    c = contrast({1: 3.0, 2: 1.0, 3: 5.0}, {1: 2.0, 2: 2.0, 3: 2.0})  # differences +1, -1, +3
    assert c.test == "paired t" and not c.same_order and c.order_count == "2/3 seeds a > b"
    assert c.ci_low < 0 < c.ci_high


def test_identical_groups_are_not_called_ordered():
    c = contrast({1: 0.0, 2: 0.0}, {1: 0.0, 2: 0.0})
    assert not c.same_order and c.order_count == "a = b in 2/2 seeds" and c.diff == 0


def test_welch_when_seeds_differ():
    c = contrast({1: 10.0, 2: 12.0}, {3: 1.0, 4: 2.0, 5: 3.0})
    assert c.test == "Welch t" and c.diff == pytest.approx(9.0)
    va, vb = 2.0 / 2, 1.0 / 3  # sample variances over n
    df = (va + vb) ** 2 / (va ** 2 / 1 + vb ** 2 / 2)
    from scipy import stats
    assert c.ci_high - c.diff == pytest.approx(stats.t.ppf(0.975, df) * math.sqrt(va + vb))
    assert c.same_order and c.order_count == "a > b in every pair of runs"


def test_one_seed_has_no_interval():
    s = summarize([3.0])
    assert s.n == 1 and s.mean == 3.0 and math.isnan(s.ci_low) and math.isnan(s.std)


def test_group_mixing_step_budgets_is_refused(tmp_path):
    v = {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}, 100: {"kurtosis": 2.0, "share": 0.1, "ppl": 9.0}}
    plant_cell(tmp_path, {"pos": "learned", "seed": 1}, v, max_steps=100)
    plant_cell(tmp_path, {"pos": "learned", "seed": 2}, v, max_steps=200)
    with pytest.raises(ValueError, match=r"group .* mixes step budgets: 100 steps \(seeds 1\); 200 steps \(seeds 2\)"):
        study.run([str(tmp_path)], plots=False)


def test_group_differing_in_a_hidden_setting_is_refused(tmp_path):
    v = {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}, 100: {"kurtosis": 2.0, "share": 0.1, "ppl": 9.0}}
    plant_cell(tmp_path, {"pos": "learned", "seed": 1}, v, extra_config={"module": {"lr": 1e-3}})
    plant_cell(tmp_path, {"pos": "learned", "seed": 2}, v, extra_config={"module": {"lr": 2e-3}})
    with pytest.raises(ValueError, match=r"differ in settings that are not overrides \(module.lr: 0.001 vs 0.002\)"):
        study.run([str(tmp_path)], plots=False)


def test_a_null_lightning_default_equals_its_value_but_not_another(tmp_path):
    """trainer.limit_val_batches: null is Lightning's 1.0 (every batch): cells from before and after the config
    changed its spelling are one group; 0.5 is another setting and is still refused."""
    v = {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}, 100: {"kurtosis": 2.0, "share": 0.1, "ppl": 9.0}}
    for seed, limit in ((1, 1.0), (2, None)):
        plant_cell(tmp_path / "same", {"pos": "learned", "seed": seed}, v,
                   extra_config={"trainer": {"max_steps": 100, "limit_val_batches": limit}})
    assert study.run([str(tmp_path / "same")], plots=False)["groups"] == {"pos=learned": 2}
    for seed, limit in ((1, 0.5), (2, None)):
        plant_cell(tmp_path / "other", {"pos": "learned", "seed": seed}, v,
                   extra_config={"trainer": {"max_steps": 100, "limit_val_batches": limit}})
    with pytest.raises(ValueError, match=r"trainer.limit_val_batches: 0.5 vs None"):
        study.run([str(tmp_path / "other")], plots=False)


def test_unfinished_cell_is_listed_not_averaged(tmp_path):
    plant_study(tmp_path)
    plant_cell(tmp_path, {"pos": "learned", "seed": 4, "experiment": "emergence_seeds"},
               {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}, 100: {"kurtosis": 1000.0, "share": 0.1, "ppl": 9.0}},
               finished=False)
    res = study.run([str(tmp_path)], plots=False)
    assert any("seed=4" in p for p in res["unfinished"])
    df = pd.read_csv(res["out"] / "study.csv")
    assert row(df, group="pos=learned", step=100, layer="layer_2", metric="hidden/kurtosis")["n"] == 3
    assert "Unfinished, left out (1)" in (res["out"] / "study.md").read_text()


def test_contrast_that_matches_no_groups_says_which_values_exist(tmp_path):
    plant_study(tmp_path)
    with pytest.raises(ValueError, match="values of pos in this study: learned, none"):
        study.run([str(tmp_path)], contrasts=["pos=learned,rope"], plots=False)


def test_contrast_refusal_names_what_else_keeps_the_groups_apart(tmp_path):
    """pos=rope cells run with another lr cannot be contrasted with pos=none; the refusal says so (it only listed
    the values of pos, which were there)."""
    v = {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}, 100: {"kurtosis": 2.0, "share": 0.1, "ppl": 9.0}}
    for seed in (1, 2):
        plant_cell(tmp_path, {"pos": "none", "seed": seed}, v)
        plant_cell(tmp_path, {"pos": "rope", "seed": seed, "module.optimizer.lr": "1e-3"}, v)
    with pytest.raises(ValueError, match=r"values of pos in this study: none, rope; the pos=rope and pos=none groups "
                                         r"also differ in module.optimizer.lr \(1e-3 vs unset\)\)$"):
        study.run([str(tmp_path)], contrasts=["pos=rope,none"], plots=False)


def test_cli_one_line_error(tmp_path, capsys):
    assert study.main([str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_seed_inside_a_run_path_groups_evaluate_cells(tmp_path):
    """evaluate.py over the seeds' runs: the seed is part of encoder.name_or_path."""
    for pos in ("learned", "none"):
        for seed in (1, 2):
            cell = tmp_path / f"{pos}{seed}"
            (cell / ".hydra").mkdir(parents=True)
            (cell / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(  # quoted, as a path with ',' must be
                [f'encoder.name_or_path="multirun/s/pos={pos},seed={seed}"']))
            (cell / ".hydra" / "config.yaml").write_text(yaml.safe_dump(
                {"encoder": {"name_or_path": f"multirun/s/pos={pos},seed={seed}"}, "seed": 0}))
            (cell / "results.json").write_text("{}")
            (cell / "anisotropy.csv").write_text(f"layer,transform,anisotropy,rogue_dims\n1,none,{0.1 * seed},3 7\n"
                                                 "1,whiten,0.0,1 2\n")
            (cell / "anisotropy_contributions.csv").write_text("layer,transform,dim,cc\n1,none,0,0.1\n1,none,1,0.2\n")
    res = study.run([str(tmp_path)], plots=False)
    df = pd.read_csv(res["out"] / "study.csv")
    assert set(df["group"]) == {"encoder.name_or_path=multirun/s/pos=learned,seed=*",
                                "encoder.name_or_path=multirun/s/pos=none,seed=*"}
    r = row(df, group="encoder.name_or_path=multirun/s/pos=none,seed=*", metric="anisotropy/none/anisotropy")
    assert r["n"] == 2 and r["mean"] == pytest.approx(0.15) and r["step"] == -1
    # text columns (dims listed as text) and per-dimension files are not averaged
    assert set(df["metric"]) == {"anisotropy/none/anisotropy", "anisotropy/whiten/anisotropy"}


def test_exported_cells_aggregate_to_the_same_study(tmp_path):
    """scripts/export_cells.py keeps what the aggregator reads (and drops per-dimension rows)."""
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("export_cells", ROOT / "scripts" / "export_cells.py")
    export_cells = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export_cells)
    sweep, out = plant_study(tmp_path / "sweep"), tmp_path / "exported"
    plant_cell(sweep, {"pos": "none", "seed": 9}, {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}}, finished=False)
    assert sorted(export_cells.export(sweep, out)) == sorted(c.name for c in sweep.iterdir() if (c / "finished.json").exists())
    assert not (out / "pos=none,seed=9").exists()  # unfinished cells are not exported
    hist = (out / "experiment=emergence_seeds,pos=learned,seed=1" / "monitor" / "hidden_states.csv").read_text()
    assert ",mean," not in hist and ",kurtosis," in hist
    a = pd.read_csv(study.run([str(sweep)], out=str(tmp_path / "a"), plots=False)["out"] / "study.csv")
    b = pd.read_csv(study.run([str(out)], out=str(tmp_path / "b"), plots=False)["out"] / "study.csv")
    pd.testing.assert_frame_equal(a, b)


def test_an_excluded_key_excludes_its_sub_keys_from_a_cells_identity(tmp_path):
    """posthoc_probe.max_sentences=200 on one seed (a re-analysis setting) must not split the group, as it does not
    move the cell's directory (startup.cell_overrides); nor must paths.cache_dir (the same recipe run where the cache
    lives elsewhere: the device cells of docs/order_use.md); a real setting under another key still does."""
    from outlierlab.studies.cells import read_cell

    base = {"pos": "none", "experiment": "emergence_seeds"}
    a = read_cell(plant_cell(tmp_path, {**base, "seed": 1}, {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}}))
    b = read_cell(plant_cell(tmp_path, {**base, "seed": 2, "posthoc_probe.max_sentences": 200,
                                        "posthoc.every": 2, "paths.cache_dir": "/elsewhere/.cache"},
                             {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}}))
    c = read_cell(plant_cell(tmp_path, {**base, "seed": 3, "posthoc_probes.x": 1},
                             {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}}))
    assert a.overrides == b.overrides and (a.seed, b.seed) == (1, 2)
    assert c.overrides != a.overrides  # a key that merely starts with the same letters is not under it



def _stop_at(cell: Path, step: int) -> None:
    """The Lightning CSV of a cell stopped at ``step`` (plant_cell writes one that reaches step 100)."""
    (cell / "csv" / "metrics.csv").write_text(f"epoch,step,val/ppl,train/loss,lr-AdamW\n0,{step},7.0,3.0,0.1\n")


def test_until_admits_cells_cut_by_the_clock_and_compares_every_cell_on_the_same_steps(tmp_path):
    """A wall-clock budget stops some cells short: without --until they are left out; with --until 50 a cell that
    reached step 50 counts (rows after 50 dropped from every cell), one that stopped before 50 stays out."""
    for pos, finals in (("learned", {1: 2.0, 2: 4.0}), ("none", {1: 1.0, 2: 1.5})):
        for seed, k in finals.items():
            cell = plant_cell(tmp_path, {"pos": pos, "seed": seed}, {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0},
                                                                    50: {"kurtosis": k, "share": 0.2, "ppl": 5.0},
                                                                    100: {"kurtosis": 10 * k, "share": 0.3, "ppl": 4.0}},
                              finished=not (pos == "none" and seed == 2))
    _stop_at(cell, 60)  # pos=none seed 2: cut at step 60
    early = plant_cell(tmp_path, {"pos": "none", "seed": 3}, {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}},
                       finished=False)
    _stop_at(early, 40)  # cut before step 50: never admitted

    plain = study.run([str(tmp_path)], contrasts=["pos=learned,none"], plots=False)
    assert plain["groups"] == {"pos=learned": 2, "pos=none": 1} and len(plain["unfinished"]) == 2

    res = study.run([str(tmp_path)], out=str(tmp_path / "until"), contrasts=["pos=learned,none"], plots=False,
                    until=50)
    assert res["groups"] == {"pos=learned": 2, "pos=none": 2}
    assert [Path(p).name for p in res["unfinished"]] == ["pos=none,seed=3"]
    assert "pos=none,seed=2: stopped at step 100 of 100, compared up to step 50" in res["notes"]
    md = (res["out"] / "study.md").read_text()
    assert "**Stopped before their budget, compared up to a step every cell reached (1):**" in md
    assert "**Notes:** 3 cells have no manifest" in md  # the finished ones; the stopped cell is listed apart
    df = pd.read_csv(res["out"] / "study.csv")
    assert df["step"].max() == 50  # the finished cells' step 100 is dropped too
    r = row(pd.read_csv(res["out"] / "contrasts.csv"), step=50, layer="layer_2", metric="hidden/kurtosis")
    assert r["n_pairs"] == 2 and r["diff"] == pytest.approx(((2 - 1) + (4 - 1.5)) / 2)


def test_a_cut_cell_takes_its_code_version_from_its_start_records(tmp_path):
    from outlierlab.studies.cells import admit_cut, read_cell

    cell = plant_cell(tmp_path, {"pos": "none", "seed": 1}, {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0},
                                                            50: {"kurtosis": 2.0, "share": 0.2, "ppl": 5.0}},
                      finished=False)
    _stop_at(cell, 50)
    (cell / "code_versions.jsonl").write_text('{"commit": "0123456789abcdef", "dirty": true}\n')
    short = read_cell(cell)
    admit_cut(short, 60)  # its numbers end at step 50
    assert not short.usable and short.cut_at is None
    c = read_cell(cell)
    admit_cut(c, 50)
    assert c.usable and c.cut_at == 50 and c.code == "0123456789ab-dirty"
    # a cut cell resumed with other settings says so too (it has no manifest, the finished cells' source of notes)
    with open(cell / "code_versions.jsonl", "a") as fh:
        fh.write('{"commit": "0123456789abcdef", "global_step_at_start": 30, '
                 '"config_changes": {"data.mlm_probability": [0.15, 0.3]}}\n')
    c = read_cell(cell)
    admit_cut(c, 50)
    assert c.notes[-1] == f"{cell.name}: resumed at step 30 with other settings: data.mlm_probability 0.15 -> 0.3"


def test_curves_keep_their_axes_with_a_long_group_label(tmp_path):
    """A group label is every override of its cells when one group is plotted (a data path makes it hundreds of
    characters): the legend and title are wrapped, so tight_layout fits them and the axes keep most of the figure
    (unwrapped, the legend outgrew the figure and the axes shrank to a sliver, with a warning)."""
    import warnings

    from matplotlib.image import imread

    from outlierlab.studies.report import _wrapped, write_curves

    group = ("analyses=[outliers,anisotropy],data.files=[/very/long/path/to/the/evaluation/sentences/of/this/study.txt],"
             "encoder.device=cpu,encoder.name_or_path=org/tiny,encoder.revision=step*,transform=[none]")
    metric = "anisotropy/none/spearman_without_top5"
    steps = [0, 1000, 2000]
    summary = pd.DataFrame({"group": group, "step": steps, "layer": "layer_2", "metric": metric, "n": 2,
                            "mean": [0.7, 0.9, 0.73], "ci_low": [0.6, 0.8, 0.6], "ci_high": [0.8, 1.0, 0.8]})
    per_seed = pd.DataFrame({"group": group, "seed": [1, 1, 1, 2, 2, 2], "step": steps * 2, "layer": "layer_2",
                             "metric": metric, "value": [0.6, 0.8, 0.7, 0.8, 1.0, 0.76]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Tight layout not applied" is a UserWarning
        [png] = write_curves(tmp_path, summary, per_seed, [metric], ["layer_2"])
    img = imread(png)[..., :3]
    # the plotted area: columns holding the mean curve's colour (matplotlib's C0, #1f77b4) span most of the width
    blue = ((abs(img[..., 0] - 0x1F / 255) < 0.05) & (abs(img[..., 1] - 0x77 / 255) < 0.05)
            & (abs(img[..., 2] - 0xB4 / 255) < 0.05))
    cols = np.flatnonzero(blue.any(0))
    assert cols.max() - cols.min() > 0.6 * img.shape[1]
    assert _wrapped(group, 60, 2).count("\n") == 1 and _wrapped(group, 60, 2).endswith("…")
    assert _wrapped("pos=learned", 60) == "pos=learned"
    assert _wrapped("mean, 95% t CI", 8) == "mean,\n95% t CI"  # an existing space is kept, not doubled


def test_a_second_aggregation_into_one_folder_leaves_none_of_the_firsts_outputs(tmp_path):
    """The first aggregation has a contrast and curves; the second, into the same --out, has neither: its folder
    kept the first's contrasts.csv and curves/ beside a study.md that has no contrast and no curve."""
    for pos, finals in (("learned", LEARNED), ("none", NONE)):  # no experiment: no declared design, no contrast
        for seed, k in finals.items():
            plant_cell(tmp_path / "cells", {"pos": pos, "seed": seed},
                       {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 900.0},
                        100: {"kurtosis": k, "share": 0.2 * seed, "ppl": 300.0 + seed}})
    out = tmp_path / "study"
    first = study.run([str(tmp_path / "cells")], out=str(out), contrasts=["pos=learned,none"], plots=True)
    assert (out / "contrasts.csv").is_file() and len(first["plots"]) == 4
    study.run([str(tmp_path / "cells")], out=str(out), contrasts=[], plots=True, metrics=["hidden/kurtosis"])
    assert not (out / "contrasts.csv").exists() and "Contrast" not in (out / "study.md").read_text()
    assert sorted(p.name for p in (out / "curves").iterdir()) == ["hidden_kurtosis__layer_2.png",
                                                                  "hidden_kurtosis__max_layer.png"]
    study.run([str(tmp_path / "cells")], out=str(out), contrasts=[], plots=False)
    assert sorted(p.name for p in out.iterdir()) == ["study.csv", "study.md"]


@pytest.mark.parametrize("name", ["study.csv", "contrasts.csv", "study.md"])
def test_a_full_disk_while_the_aggregator_writes_leaves_no_torn_file(tmp_path, monkeypatch, name):
    """ENOSPC 200 bytes into one output: it is absent (or the earlier one), never cut short under its own name."""
    from tests.disk_helpers import fill_disk_for

    plant_study(tmp_path / "cells")
    out = tmp_path / "study"
    fill_disk_for(monkeypatch, name)
    with pytest.raises(OSError, match="No space left"):
        study.run([str(tmp_path / "cells")], out=str(out), contrasts=["pos=learned,none"], plots=True)
    monkeypatch.undo()
    assert not list(out.rglob(name)) and not [p for p in out.rglob("*") if "partial" in p.name]


@pytest.mark.parametrize(("option", "says"), [
    (["--metrics", "hidden/kurtosis,hidden/kurtosiss"],
     "--metrics hidden/kurtosiss: not in these cells; they have 4: hidden/argmax_share, hidden/kurtosis, "
     "train/loss, val/ppl"),
    (["--layers", "layer_9"], "--layers layer_9: not in these cells; they have 4: layer_1, layer_2, max_layer, model"),
    (["--until", "-3"], "--until -3: give a training step >= 0"),
])
def test_a_name_the_cells_do_not_have_is_one_line_not_dropped(tmp_path, capsys, option, says):
    """A typo in --metrics or --layers was dropped without a word (the study showed the other metrics, or the
    default ones when none was left); --until below 0 ended in a KeyError traceback."""
    plant_study(tmp_path / "cells")
    assert study.main([str(tmp_path / "cells"), "--out", str(tmp_path / "out"), "--no-plots", *option]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {says}"), err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_failed_cell_is_listed_with_its_error_apart_from_unfinished_ones(tmp_path, capsys):
    from outlierlab.jobs.run_state import mark_failed

    plant_study(tmp_path)
    v = {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 9.0}, 100: {"kurtosis": 1000.0, "share": 0.1, "ppl": 9.0}}
    plant_cell(tmp_path, {"pos": "learned", "seed": 4, "experiment": "emergence_seeds"}, v, finished=False)
    failed = plant_cell(tmp_path, {"pos": "learned", "seed": 5, "experiment": "emergence_seeds"}, v, finished=False)
    mark_failed(failed, "CUDA out of memory", 40)
    res = study.run([str(tmp_path)], plots=False)
    assert [Path(p).name for p in res["unfinished"]] == [next(c.name for c in tmp_path.iterdir() if "seed=4" in c.name)]
    assert res["failed"] == {failed.name: "step 40: CUDA out of memory"}
    md = (res["out"] / "study.md").read_text()
    assert "Unfinished, left out (1)" in md and "Failed, left out (1)" in md
    assert f"* {failed.name}: step 40: CUDA out of memory" in md
    assert study.main([str(tmp_path), "--no-plots"]) == 0
    assert f"failed (left out): {failed.name}: step 40: CUDA out of memory" in capsys.readouterr().out
