"""Outlier monitors: planted LayerNorm/activation outliers are found, TensorBoard + CSV history are written with
the documented tags, and a resumed run continues the history with no gap and no duplicate."""

from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from monitor_fixtures import PLANT_BIAS, PLANT_GAIN, fit, planted_row, tiny_module, tiny_tokenizer
from outlierlab.metrics.activations import activation_kurtosis
from outlierlab.metrics.monitor_records import hidden_state_records, layernorm_records, tokenize_heldout
from outlierlab.metrics.similarity import anisotropy, paired_sentence_tokens
from outlierlab.monitoring.hidden_state_monitor import HiddenStateMonitor
from outlierlab.monitoring.history import HistoryCSV, read_history, vectors_by_step


# ------------------------------------------------------------------------------------ helpers
def csv_rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def event_accumulator(logdir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0, "histograms": 0})
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer):
    """Run A: 20 steps, checkpoints at 10 and 20.  Run B: resume A's step-10 checkpoint to step 30."""
    root = tmp_path_factory.mktemp("monitored_run")
    module_a = fit(root, tokenizer, 20, tb_version="a")
    after_a = (root / "monitor" / "layernorm.csv").read_text(), (root / "monitor" / "hidden_states.csv").read_text()
    weights_a = {k: v.clone() for k, v in module_a.state_dict().items()}
    fit(root, tokenizer, 30, ckpt_path=str(root / "checkpoints" / "step010.ckpt"), tb_version="b")
    return {"root": root, "after_a": after_a, "weights_a": weights_a}


# ------------------------------------------------------------------------------------ pure computations
def test_layernorm_records_flag_planted_dims_and_the_rules_model_dims():
    d = 64
    ones = torch.ones(d, dtype=torch.float64)
    params = {"embeddings": (1 + 0.05 * planted_row(d, 9, 6.0), 0.05 * planted_row(d, 9, 6.0, seed=9))}
    for i in range(4):  # dim 20: gain AND bias in the output LN of layers 0, 2; dim 5: bias only in layer 1
        gain = 1 + 0.05 * planted_row(d, 20, 6.0, seed=i) if i in (0, 2) else ones.clone()
        bias = (0.05 * planted_row(d, 20, 5.0, seed=i + 4) if i in (0, 2)
                else 0.05 * planted_row(d, 5, -5.0, seed=i) if i == 1 else torch.zeros(d))
        params[f"layer.{i}.attention_output"] = (ones.clone(), torch.zeros(d))
        params[f"layer.{i}.output"] = (gain, bias)
    initial = {n: (ones.clone(), torch.zeros(d)) for n in params}
    rows, summary = layernorm_records(7, params, initial, vectors=False)
    flagged = {(n, s, dim) for st, n, s, dim, v in rows if s.endswith("_outlier") or s == "outlier_dim"}
    assert flagged == {("embeddings", "gain_outlier", 9), ("embeddings", "bias_outlier", 9),
                       ("layer.0.output", "gain_outlier", 20), ("layer.0.output", "bias_outlier", 20),
                       ("layer.2.output", "gain_outlier", 20), ("layer.2.output", "bias_outlier", 20),
                       ("layer.1.output", "bias_outlier", 5),
                       # the rule: gain AND bias, output LNs only (never the embeddings'), 2 of 4 layers
                       ("layer.0.output", "rule_outlier", 20), ("layer.2.output", "rule_outlier", 20),
                       ("model", "outlier_dim", 20)}
    assert summary["min_layers"] == 2 and summary["outliers"].dims == [20]
    by = {(n, s): (dim, v) for st, n, s, dim, v in rows}
    assert all(st == 7 for st, *_ in rows)
    assert by[("layer.2.output", "max_abs_gain_div")] == (20, pytest.approx(float(params["layer.2.output"][0][20] - 1)))
    assert by[("model", "n_outlier_dims")] == (None, 1) and by[("model", "min_layers")] == (None, 2)


def test_hidden_state_records_count_argmax_share_on_valid_tokens_only():
    g = torch.Generator().manual_seed(0)
    L_, B, T, d, k = 3, 10, 13, 16, 5
    hidden = torch.randn(L_, B, T, d, generator=g) * 0.1
    attn = torch.ones(B, T, dtype=torch.long)
    attn[:, 12] = 0  # padding
    special = torch.zeros(B, T, dtype=torch.long)
    special[:, 0] = special[:, 11] = 1  # <s> ... </s>: 10 valid tokens per row, 100 in all
    hidden[2, :, 1:11, k] = 10.0
    hidden[2, :, 1:11, 2] = -5.0  # ... and dim 2 their minimum,
    hidden[2, :, 1, k] = -10.0  # except for 10 of 100 tokens, whose minimum is dim k
    hidden[2, :, [0, 11, 12], 9] = 50.0  # specials/padding would move the shares if they were counted
    rows, summary = hidden_state_records(3, hidden, attn, special, top_k=2, n_pairs=300, seed=1)
    by = {(n, s): (dim, v) for st, n, s, dim, v in rows if s not in ("mean", "top_abs_mean", "outlier_dim")}
    assert by[("layer_2", "argmax_share")] == (k, pytest.approx(0.9, abs=1e-12))
    assert by[("layer_2", "argmin_share")] == (2, pytest.approx(0.9, abs=1e-12))
    assert by[("layer_2", "n_tokens")] == (None, 100)
    assert by[("layer_0", "argmax_share")][1] < 0.5
    assert ("layer_2", "outlier_dim", k) in {(n, s, dim) for _, n, s, dim, _ in rows}
    mean_k = [v for _, n, s, dim, v in rows if (n, s, dim) == ("layer_2", "mean", k)]
    assert mean_k == [pytest.approx((90 * 10.0 - 10 * 10.0) / 100, abs=1e-9)]
    # layer 2 ≈ two directions, u = (+10, −5) on (k, 2) for 90% of tokens and v = (−10, −5) for 10%:
    # E[cos] = (0.9² + 0.1²)·1 + 2·0.9·0.1·cos(u, v) with cos(u, v) = (−100 + 25)/125 = −0.6  → 0.712
    # anisotropy draws 300 pairs with replacement, close to that expectation
    assert float(summary["anisotropy"][2]) == pytest.approx(0.82 - 0.18 * 0.6, abs=0.12)
    assert abs(float(summary["anisotropy"][0])) < 0.2  # isotropic noise
    # anisotropy_one_per_sentence is evaluate.py's protocol: one token per sentence, 10 sentences -> 5 disjoint
    # pairs; anisotropy itself is the n_pairs estimate, with a jackknife standard error beside it
    valid = (attn.bool() & ~special.bool())
    a, b = paired_sentence_tokens(valid.nonzero()[:, 0], generator=1)
    tokens = hidden[:, valid]
    assert by[("layer_2", "n_anisotropy_pairs")] == (None, 300)
    assert torch.allclose(summary["anisotropy_one_per_sentence"], anisotropy(tokens[:, a], tokens[:, b]).double())
    # one name per quantity: the estimate is written once, as anisotropy
    assert "token_pair_cosine" not in summary and not any(s == "token_pair_cosine" for _, _, s, _, _ in rows)
    assert 0 < by[("layer_2", "anisotropy_se")][1] < 0.2
    # the same seed gives the same pairs
    again = hidden_state_records(3, hidden, attn, special, top_k=2, n_pairs=300, seed=1)[1]
    assert torch.equal(again["anisotropy"], summary["anisotropy"])
    # the modern metrics are the analysis functions' values on the valid tokens (specials/padding excluded)
    assert by[("layer_2", "kurtosis")][1] == pytest.approx(float(activation_kurtosis(tokens[2])))
    assert by[("layer_2", "max_abs")] == (k, pytest.approx(10.0))


def test_hidden_monitor_finds_planted_final_layernorm_bias_and_restores_train_mode(tokenizer):
    module = tiny_module(len(tokenizer), planted=False)
    k = 11
    with torch.no_grad():
        module.model.named_layernorms()["layer.1.output"].bias[k] = 40.0  # final LayerNorm of a 2-layer model
    module.train()
    module.model.lm_head.eval()  # a submodule deliberately in eval mode must stay so
    monitor = HiddenStateMonitor(n_sequences=16, n_pairs=200)
    monitor.tracker.batch = tokenize_heldout(tokenizer, ["a first sentence", "and a second, longer one here"] * 8, 64)
    rows, summary = monitor.compute(None, module, step=0)
    share = {n: (dim, v) for _, n, s, dim, v in rows if s == "argmax_share"}
    assert share["layer_2"][0] == k and share["layer_2"][1] > 0.99
    assert share["layer_1"][1] < 0.5
    assert module.model.roberta.training and not module.model.lm_head.training
    assert summary["outliers"][2][0] == k
    # the planted bias 40 is in the output LayerNorm of block 2: its output's inf-norm holds it, its input's not
    by = {(n, s): v for _, n, s, dim, v in rows}
    assert by[("layer_2", "inf_norm_ln_output")] == pytest.approx(40.0, abs=3.0)
    assert by[("layer_2", "inf_norm_ln_input")] < 20.0
    assert 0.0 <= by[("layer_1", "sink_share_bos")] <= 1.0 and by[("layer_1", "attn_entropy")] > 0.0
    assert by[("layer_1", "attn_row_mass")] == pytest.approx(1.0) == by[("layer_2", "attn_row_mass")]  # softmax
    assert ("model", "pooled_argmax_share") in by


# ------------------------------------------------------------------------------------ history file
def test_history_drops_torn_line_and_truncates_atomically(tmp_path):
    h = HistoryCSV(tmp_path / "h.csv")
    h.append([(0, "a", "x", None, 1.0), (5, "a", "x", 3, 2.5)])
    with open(h.path, "a") as fh:
        fh.write("10,a,x,,")  # a crash in the middle of a row
    assert h.steps() == {0, 5}
    h.truncate_after(5)
    h.append([(10, "a", "x", None, 3.0)])
    assert [(r["step"], r["dim"], r["value"]) for r in read_history(h.path)] == [(0, None, 1.0), (5, 3, 2.5), (10, None, 3.0)]
    h.truncate_after(4)
    assert h.steps() == {0} and sorted(p.name for p in tmp_path.iterdir()) == ["h.csv"]


def test_no_documented_reader_returns_a_row_from_a_torn_line(tmp_path):
    import pandas as pd

    from outlierlab.monitoring.history import history_frame

    h = HistoryCSV(tmp_path / "hidden_states.csv")
    h.append([(0, "layer_1", "argmax_share", 7, 0.25), (50, "layer_1", "argmax_share", 7, 0.5)])
    with open(h.path, "a") as fh:
        fh.write("100,layer_1,argmax_share,7,0.1")  # a kill mid-row: "0.11982517" cut to "0.1"
    assert 100 in set(pd.read_csv(h.path)["step"])  # the hazard: a bare read_csv takes the torn row as data
    frame = history_frame(h.path)
    assert frame["step"].tolist() == [0, 50] and frame["value"].tolist() == [0.25, 0.5]
    assert str(frame["dim"].dtype) == "Int64" and [r["step"] for r in read_history(h.path)] == [0, 50]
    assert history_frame(h.path, statistics=["kurtosis"]).empty


def test_a_full_disk_mid_append_leaves_the_last_complete_row(tmp_path, monkeypatch):
    import builtins

    from tests.disk_helpers import FillingFile

    h = HistoryCSV(tmp_path / "layernorm.csv")
    h.append([(0, "embeddings", "gain_z", 3, 1.5)])
    before = h.path.read_bytes()
    real_open = builtins.open

    def fake_open(file, mode="r", *a, **k):
        fh = real_open(file, mode, *a, **k)
        return FillingFile(fh, {"left": 7}) if str(file) == str(h.path) and "a" in mode else fh

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr("pathlib.Path.open", lambda self, mode="r", *a, **k: fake_open(self, mode, *a, **k))
    with pytest.raises(OSError, match=r"cannot append to .*layernorm.csv: No space left on device; .*free space"):
        h.append([(50, "embeddings", "gain_z", 3, 2.0)])
    monkeypatch.undo()
    assert h.path.read_bytes() == before  # the 7 bytes written before the error are gone
    assert [r["step"] for r in read_history(h.path)] == [0]


def test_a_full_disk_while_a_resume_rewrites_the_history_leaves_it_whole_and_no_staging_file(tmp_path, monkeypatch):
    """A resume drops the rows after its step by rewriting the file; ENOSPC 10 bytes into the rewrite raises, keeps
    the history as it was and leaves no staging file (``h.csv.tmp`` was left behind, beside the monitor's files)."""
    from tests.disk_helpers import fill_disk_for

    h = HistoryCSV(tmp_path / "h.csv")
    h.append([(0, "a", "x", None, 1.0), (5, "a", "x", 3, 2.5), (10, "a", "x", None, 3.0)])
    before = h.path.read_bytes()
    fill_disk_for(monkeypatch, "h.csv", left=10)
    with pytest.raises(OSError, match="No space left"):
        h.truncate_after(5)
    monkeypatch.undo()
    assert h.path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["h.csv"]
    h.truncate_after(5)  # space freed: the same resume goes through
    assert h.steps() == {0, 5}


# ------------------------------------------------------------------------------------ through Lightning
def test_step0_rows_flag_exactly_the_planted_layernorm_dims(runs):
    layernorm_csv, _ = runs["after_a"]
    rows = list(csv.DictReader(layernorm_csv.splitlines()))
    step0 = [r for r in rows if r["step"] == "0"]
    flagged = {(r["name"], r["statistic"], int(r["dim"])) for r in step0 if r["statistic"].endswith("_outlier")}
    # gain-only and attention-output-bias-only plants: the rule (gain AND bias, output LNs) flags neither
    assert flagged == {(PLANT_GAIN[0], "gain_outlier", PLANT_GAIN[1]), (PLANT_BIAS[0], "bias_outlier", PLANT_BIAS[1])}
    assert {(r["name"], r["statistic"], r["value"]) for r in step0 if r["name"] == "model"} == {
        ("model", "min_layers", "1"), ("model", "n_outlier_dims", "0")}  # 2 layers: "4/12" rounds up to 1
    counts = {(r["name"], r["statistic"]): float(r["value"]) for r in step0
              if r["statistic"].startswith("n_") and r["name"] != "model"}
    assert counts[(PLANT_GAIN[0], "n_gain_outliers")] == 1 and counts[(PLANT_BIAS[0], "n_bias_outliers")] == 1
    assert sum(counts.values()) == 2
    # divergence from init is 0 at step 0 and grows once training moves the weights
    div = {(r["step"], r["name"]): float(r["value"]) for r in rows if r["statistic"] == "max_abs_gain_div"}
    assert div[("0", "layer.0.output")] == 0.0 and div[("20", "layer.0.output")] > 0.0


def test_tensorboard_tags_and_values(runs):
    root = runs["root"]
    acc = event_accumulator(root / "tb" / "a")
    tags = acc.Tags()
    ln, hs = "monitor/layernorm", "monitor/hidden"
    for name in ("embeddings", "layer.0.attention_output", "layer.1.output"):
        for stat in ("n_gain_outliers", "n_bias_outliers", "max_abs_gain_div", "max_abs_bias_div"):
            assert f"{ln}/{name}/{stat}" in tags["scalars"]
        assert {f"{ln}/{name}/gain", f"{ln}/{name}/bias"} <= set(tags["histograms"])
    for i in range(3):
        for stat in ("argmax_share", "argmin_share", "argmax_dim", "argmin_dim", "anisotropy", "max_abs_mean",
                     "n_outlier_dims"):
            assert f"{hs}/layer_{i}/{stat}" in tags["scalars"]
    assert f"{ln}/n_outlier_dims" in set(tags["scalars"])
    assert {f"{ln}/heatmap_gain", f"{ln}/heatmap_bias", f"{hs}/mean_vectors"} <= set(tags["images"])
    n_gain = {e.step: e.value for e in acc.Scalars(f"{ln}/{PLANT_GAIN[0]}/n_gain_outliers")}
    assert sorted(n_gain) == [0, 5, 10, 15, 20] and n_gain[0] == 1
    planted = acc.Scalars(f"{ln}/{PLANT_GAIN[0]}/gain_dim_{PLANT_GAIN[1]}")
    assert planted[0].step == 0 and planted[0].value == pytest.approx(1 + 0.05 * float(
        planted_row(64, PLANT_GAIN[1], PLANT_GAIN[2])[PLANT_GAIN[1]]), rel=1e-6)
    # the scalar equals the CSV value of the same step
    share = {e.step: e.value for e in acc.Scalars(f"{hs}/layer_2/argmax_share")}
    csv_share = {int(r["step"]): float(r["value"]) for r in csv.DictReader(runs["after_a"][1].splitlines())
                 if r["name"] == "layer_2" and r["statistic"] == "argmax_share"}
    assert share.keys() == csv_share.keys() and all(share[s] == pytest.approx(csv_share[s], rel=1e-6) for s in share)
    # the |x| argmax dimension (what outlierlab.studies.dim_identity reads from the CSV's dim column) as a curve
    dims = {e.step: e.value for e in acc.Scalars(f"{hs}/layer_2/abs_argmax_dim")}
    csv_dims = {int(r["step"]): float(r["dim"]) for r in csv.DictReader(runs["after_a"][1].splitlines())
                if r["name"] == "layer_2" and r["statistic"] == "abs_argmax_share"}
    assert dims == csv_dims and len(dims) == 5
    assert sorted(e.step for e in acc.Images(f"{ln}/heatmap_gain")) == [0, 20]
    for png in ("layernorm_heatmap_gain.png", "layernorm_heatmap_bias.png", "hidden_mean_vectors.png"):
        assert (root / "monitor" / png).stat().st_size > 1000


def test_resume_continues_history_without_gap_or_duplicate(runs):
    root = runs["root"]
    for fname, before in zip(("layernorm.csv", "hidden_states.csv"), runs["after_a"]):
        rows = csv_rows(root / "monitor" / fname)
        keys = Counter((r["step"], r["name"], r["statistic"], r["dim"]) for r in rows)
        assert max(keys.values()) == 1, f"duplicated rows in {fname}"
        assert sorted({int(r["step"]) for r in rows}) == list(range(0, 31, 5))
        # rows up to the resumed step are the first run's, byte for byte
        old = [line for line in before.splitlines()[1:] if int(line.split(",")[0]) <= 10]
        new = (root / "monitor" / fname).read_text().splitlines()[1:]
        assert new[: len(old)] == old
        # every recorded step has the same summary rows; per-dim vectors only at image steps (0, 20, end)
        per_step = Counter(int(r["step"]) for r in rows if r["statistic"] in ("gain_mean", "n_tokens"))
        assert len(set(per_step.values())) == 1
        assert {int(r["step"]) for r in rows if r["statistic"] in ("gain", "mean")} == {0, 20, 30}


def test_resume_keeps_the_initial_snapshot(runs):
    """Divergence after resume is measured from the planted step-0 values, not from the standard init (1, 0)."""
    rows = read_history(runs["root"] / "monitor" / "layernorm.csv")
    steps, gain = vectors_by_step(rows, "gain")[PLANT_GAIN[0]]
    div = {(r["step"]): (r["dim"], r["value"]) for r in rows
           if r["name"] == PLANT_GAIN[0] and r["statistic"] == "max_abs_gain_div"}
    moved = (gain[steps.index(30)] - gain[0]).abs()
    assert div[30][1] == pytest.approx(float(moved.max()), rel=1e-5, abs=1e-7) and div[30][0] == int(moved.argmax())
    from_standard_init = float((gain[steps.index(30)] - 1).abs().max())
    assert from_standard_init > 10 * div[30][1]  # the planted dim would dominate a lost snapshot


def test_monitors_do_not_change_training(runs, tmp_path, tokenizer):
    plain = fit(tmp_path, tokenizer, 20, monitors=False)
    for name, value in plain.state_dict().items():
        assert torch.equal(value, runs["weights_a"][name]), name


def test_anisotropy_standard_error_is_the_delete_one_sentence_jackknife():
    """The SE of the 1,000-pair anisotropy, checked against an explicit leave-one-sentence-out loop."""
    from outlierlab.metrics.monitor_records import jackknife_se_by_sentence

    cos = torch.tensor([[0.9, 0.1, 0.5, 0.3, 0.7, 0.2]], dtype=torch.float64)
    sa = torch.tensor([0, 0, 1, 2, 3, 1])
    sb = torch.tensor([1, 2, 3, 3, 0, 2])
    thetas = []
    for k in range(4):
        keep = (sa != k) & (sb != k)
        thetas.append(float(cos[0, keep].mean()))
    mean = sum(thetas) / 4
    expected = math.sqrt(3 / 4 * sum((t - mean) ** 2 for t in thetas))
    assert float(jackknife_se_by_sentence(cos, sa, sb)[0]) == pytest.approx(expected, rel=1e-12)
    # equal cosines everywhere: no spread, SE 0; two sentences: no jackknife
    assert float(jackknife_se_by_sentence(torch.full((1, 6), 0.4, dtype=torch.float64), sa, sb)[0]) == pytest.approx(0)
    assert math.isnan(float(jackknife_se_by_sentence(cos[:, :1], sa[:1], sb[:1])[0]))


def test_metric_curves_label_log_panels_in_plain_numbers_inside_the_figure():
    """The metric-curves figure (drawn at every image record) has fixed margins: its log-scale panels must label
    ticks "10", "1000" (matplotlib's "3 × 10⁰" did not fit them), and no tick label may fall outside the figure."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from outlierlab.monitoring import monitor_plots as plots

    steps = list(range(0, 1000, 50))
    curves = {"kurtosis": {layer: (steps, list(np.logspace(0, 4, len(steps)) * (layer + 1))) for layer in range(3)},
              "max_median": {layer: (steps, list(1.2 + 0.1 * np.sin(np.arange(len(steps))))) for layer in range(3)},
              "argmax_share": {layer: (steps, [0.1] * len(steps)) for layer in range(3)},
              "anisotropy": {layer: (steps, [0.5] * len(steps)) for layer in range(3)}}
    fig = plots.metric_curves_figure(curves, title="a run")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer, (width, height) = canvas.get_renderer(), canvas.get_width_height()
    labels = [t for ax in fig.axes for minor in (False, True)  # the drawn ones: ticks inside the view limits
              for t, y in zip(ax.get_yticklabels(minor=minor), ax.get_yticks(minor=minor))
              if t.get_text() and min(ax.get_ylim()) <= y <= max(ax.get_ylim())]
    log_labels = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert "1000" in log_labels or "1e+03" in log_labels, log_labels
    assert not any("times" in t.get_text() or "^" in t.get_text() for t in labels)
    for t in labels:
        box = t.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= width and box.y0 >= 0 and box.y1 <= height, (t.get_text(), box)


def test_metric_curves_have_one_legend_for_every_panel_and_draw_rounding_noise_flat():
    """Every panel's layer colours are named once, in a figure legend listing each layer; a statistic constant up to
    float rounding (a softmax row's mass, 1 ± 1e-7) spans at least 1 % of its value, not its noise magnified."""
    from outlierlab.monitoring import monitor_plots as plots

    steps = list(range(0, 500, 50))
    noise = [1.0 + 1e-7 * (-1) ** i for i in range(len(steps))]
    curves = {"kurtosis": {layer: (steps, [3.0 + layer] * len(steps)) for layer in range(1, 4)},
              "attn_row_mass": {layer: (steps, noise) for layer in range(0, 4)}}
    fig = plots.metric_curves_figure(curves)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [f"layer {i}" for i in range(4)]
    assert not any(ax.get_legend() for ax in fig.axes)
    low, high = fig.axes[1].get_ylim()
    assert high - low >= 0.01 - 1e-12 and low < 1.0 < high


def test_heatmap_colours_span_the_bulk_of_the_values_and_name_the_saturated_largest():
    """A few outlier entries saturate instead of setting the colour scale (which left the rest white)."""
    import numpy as np

    from outlierlab.monitoring import monitor_plots as plots

    values = np.full((10, 200), 0.01)
    values[:, 7] = 1.9  # one dim of 200: 0.5 % of the entries
    span, largest = plots.colour_span(values)
    assert span == pytest.approx(0.01) and largest == pytest.approx(1.9)
    fig = plots.layernorm_heatmap([0, 10], {"ln": np.vstack([values[0], values[1]])}, {"ln": [7]}, "bias", 0.0)
    assert "beyond saturates; largest 1.9" in fig.axes[0].get_title(loc="left")
