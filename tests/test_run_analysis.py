"""Post-hoc analysis of a run's checkpoints reproduces the live monitors' rows for the same steps."""

from __future__ import annotations

import csv
import shutil

import pytest

from monitor_fixtures import fit, tiny_tokenizer
from outlierlab.jobs.posthoc import main
from outlierlab.monitoring.replay import analyze_run, monitor_settings


def rows_by_key(path, steps):
    with open(path, newline="") as fh:
        return {(r["step"], r["name"], r["statistic"], r["dim"]): float(r["value"])
                for r in csv.DictReader(fh) if int(r["step"]) in steps}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("finished_run")
    tok = tiny_tokenizer()
    fit(root, tok, 20)  # live monitors every 5 steps (8 sentences, 200 pairs); checkpoints at 10 and 20
    tok.save_pretrained(root / "hf")
    shutil.copy(root / "checkpoints" / "step020.ckpt", root / "checkpoints" / "last.ckpt")
    # the run's own monitor settings are picked up from config.yaml (as train.py writes it)
    (root / "config.yaml").write_text("callbacks:\n  hidden_state_monitor:\n    n_sequences: 8\n    n_pairs: 200\n"
                                      "  layernorm_monitor:\n    top_k: 3\n")
    return root


def test_settings_come_from_the_run_config(run):
    ln, hs = monitor_settings(run)
    assert (hs["n_sequences"], hs["n_pairs"], hs["top_k"], ln["top_k"], ln["rule"]) == (8, 200, 5, 3, None)


def test_posthoc_rows_equal_live_rows_for_checkpointed_steps(run):
    res = analyze_run(run)
    assert res["steps"] == [10, 20]  # last.ckpt duplicates step 20 and is analysed once
    live_ln = rows_by_key(run / "monitor" / "layernorm.csv", {0, 10, 20})
    post_ln = rows_by_key(res["layernorm"], {0, 5, 10, 15, 20})
    assert {k[0] for k in post_ln} == {"0", "10", "20"}
    # LayerNorm: identical weights -> identical rows; step 0 comes from the init snapshot in the checkpoint.
    # Live per-dim vectors exist at image steps only (0 and 20 here); post hoc at every checkpoint.
    assert set(live_ln) <= set(post_ln) and {k[2] for k in set(post_ln) - set(live_ln)} == {"gain", "bias"}
    assert {k: post_ln[k] for k in live_ln} == live_ln
    live_hs = rows_by_key(run / "monitor" / "hidden_states.csv", {10, 20})
    post_hs = rows_by_key(res["hidden_states"], {0, 10, 20})
    # beyond the live rows: every dim's mean (live at image steps only), and the loop monitors' order-use rows, which
    # train.py's monitor leaves to its validation (val/order_use)
    assert set(live_hs) <= set(post_hs) and {k[2] for k in set(post_hs) - set(live_hs)} == {
        "mean", "order_use", "attn_local", "attn_local_uniform"}
    # NaN where both are undefined (a rogue-dimension share of an anisotropy within 2 standard errors of 0)
    assert all(post_hs[k] == pytest.approx(live_hs[k], rel=1e-4, abs=1e-5, nan_ok=True) for k in live_hs), \
        [(k, post_hs[k], live_hs[k]) for k in live_hs
         if post_hs[k] != pytest.approx(live_hs[k], rel=1e-4, abs=1e-5, nan_ok=True)][:5]
    # and the statistics differ between the two steps (the comparison is not vacuous)
    assert any(abs(post_hs[("10", n, s, d)] - post_hs[("20", n, s, d)]) > 1e-3
               for (st, n, s, d) in post_hs if st == "10" and s == "mean")


def test_cli(run, capsys, tmp_path):
    assert main([str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.startswith("error: run directory")
    assert main([str(run), "--out", str(tmp_path / "out"), "--n-sequences", "4"]) == 0
    with open(tmp_path / "out" / "hidden_states.csv", newline="") as fh:
        n_tokens = [r for r in csv.DictReader(fh) if r["statistic"] == "n_tokens" and r["name"] == "layer_0"]
    live = rows_by_key(run / "monitor" / "hidden_states.csv", {10})
    assert 0 < float(n_tokens[0]["value"]) < live[("10", "layer_0", "n_tokens", "")]  # 4 sentences, not 8


def test_metrics_table_per_step_and_layer_matches_the_long_rows(run, tmp_path):
    res = analyze_run(run, out_dir=tmp_path / "post")
    with open(res["metrics"], newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [(int(r["step"]), int(r["layer"])) for r in table] == [(s, l) for s in (10, 20) for l in range(3)]
    long = rows_by_key(res["hidden_states"], {10, 20})
    for r in table:
        key = (r["step"], f"layer_{r['layer']}")
        assert float(r["kurtosis"]) == pytest.approx(long[key + ("kurtosis", "")])
        assert float(r["argmin_share"]) == pytest.approx(long[key + ("argmin_share", r["argmin_share_dim"])])
        if r["layer"] == "0":  # the embedding output has no block: no sites, no attention, no LayerNorm rule
            assert r["inf_norm_ffn_output"] == r["sink_share_bos"] == r["n_layernorm_outliers"] == ""
        else:
            assert float(r["inf_norm_ln_output"]) >= float(r["max_abs"]) - 1e-4  # specials included in the former
            assert int(r["n_layernorm_outliers"]) >= 0 and 0.0 <= float(r["sink_share_bos"]) <= 1.0
    assert (tmp_path / "post" / "metrics.png").stat().st_size > 0


def test_order_use_and_attention_locality_on_every_checkpoint(run, tmp_path):
    """Order use per checkpoint (held-out sentences, a fixed 15 % masked) equals order_use() called on the checkpoint
    directly, and the attn_local column is the locality of the checkpoint's attention."""
    import torch

    from outlierlab.metrics.word_order import lm_loss_sum, masked_for_order_use, order_use
    from outlierlab.metrics.monitor_records import tokenize_heldout
    from outlierlab.datamodules.eval_data import load_sentences
    from outlierlab.models.checkpoint import model_from_checkpoint

    res = analyze_run(run, out_dir=tmp_path / "post")
    with open(res["order_use"], newline="") as fh:
        rows = {int(r["step"]): r for r in csv.DictReader(fh)}
    assert sorted(rows) == [10, 20]
    tok = tiny_tokenizer()
    ckpt = torch.load(run / "checkpoints" / "step020.ckpt", map_location="cpu", weights_only=False)
    model = model_from_checkpoint(ckpt, "step 20").eval()
    batch = tokenize_heldout(tok, load_sentences(None)[:8], model.config.max_len)
    problem = masked_for_order_use(batch["input_ids"], batch["attention_mask"], batch["special_tokens_mask"],
                                   tok.mask_token_id)
    special = {model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id}
    with torch.inference_mode():
        expected = order_use(lm_loss_sum(model, False), [problem], special)
    assert float(rows[20]["order_use"]) == pytest.approx(expected["order_use"], abs=1e-6)
    assert float(rows[20]["loss"]) == pytest.approx(expected["loss"], rel=1e-6)
    with open(res["metrics"], newline="") as fh:
        local = {(int(r["step"]), int(r["layer"])): r["attn_local"] for r in csv.DictReader(fh)}
    assert local[(20, 0)] == "" and 0.0 < float(local[(20, 1)]) <= 1.0


def test_a_posthoc_analysis_killed_between_its_outputs_leaves_one_generation(run, tmp_path, monkeypatch):
    """The histories of a second analysis are written, then it dies before its order_use.csv: the folder still holds
    the first generation byte for byte (no history of one run beside metrics of another), and the next analysis
    clears the dead one's staging folder."""
    import outlierlab.monitoring.replay as replay

    out = tmp_path / "post"
    analyze_run(run, out_dir=out)
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"layernorm.csv", "hidden_states.csv", "metrics.csv", "order_use.csv"} <= set(first)
    real = replay.write_csv

    def dies_at_order_use(path, *a, **k):
        if path.name == "order_use.csv":
            raise KeyboardInterrupt  # stands in for a kill: nothing after this point runs
        return real(path, *a, **k)

    monkeypatch.setattr(replay, "write_csv", dies_at_order_use)
    with pytest.raises(KeyboardInterrupt):
        analyze_run(run, out_dir=out, n_sequences=3)  # another setting: its rows would differ
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    staging = list(tmp_path.glob(".post.partial-*"))
    assert staging and (staging[0] / "hidden_states.csv").exists()  # the new generation never reached `out`
    monkeypatch.undo()
    staging[0].rename(tmp_path / ".post.partial-4194303")  # as if its process (a pid never alive here) was killed
    analyze_run(run, out_dir=out, n_sequences=3)
    assert not list(tmp_path.glob(".post.partial-*"))
    assert (out / "hidden_states.csv").read_bytes() != first["hidden_states.csv"]


def test_a_full_disk_in_the_posthoc_job_is_one_line_with_the_remedy(run, monkeypatch, capsys):
    import errno

    import outlierlab.jobs.posthoc as posthoc

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(posthoc, "analyze_run", full)
    assert posthoc.main([str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: no space left on the device writing {run} ") and \
        "free space there" in err[0]
