"""Puccetti et al. frequency analysis (outlierlab.evaluation.analyses.frequency) and attention sinks (outlierlab.evaluation.analyses.attention_sinks)."""

from __future__ import annotations

import numpy as np
import math

import pytest
import torch
from omegaconf import OmegaConf

from ablation_fixtures import PLANTED_DIM, make_ctx, save_planted
from probe_fixtures import SENTENCES

CORPUS = ["the the the the the cat", "the cat sat", "a dog", "the cat and the dog and the bird"]


# -------------------------------------------------------------------------------------------- frequency
def test_frequency_table_known_rank_correlation():
    """6 types with known frequencies; per-type values designed so ρ is +1, -1 and a hand-computed value."""
    from outlierlab.metrics.frequency_stats import frequency_table

    freq = np.zeros(20, dtype=np.int64)
    types = np.array([3, 5, 8, 11, 14, 17])
    freq[types] = [50, 10, 90, 30, 70, 20]  # ranks 4, 1, 6, 3, 5, 2
    perm_ranks = np.array([2, 1, 3, 6, 4, 5])  # dim 2's designed mean ranks per type
    d2 = ((np.array([4, 1, 6, 3, 5, 2]) - perm_ranks) ** 2).sum()
    rho_expected = 1 - 6 * d2 / (6 * (36 - 1))  # Spearman without ties
    design = np.stack([freq[types] / 10.0, -freq[types] / 10.0, perm_ranks.astype(float)], -1)  # [6 types, 3]

    # Each type occurs 3 times with values mean ± 0.4 (so only the MEAN over occurrences has the design),
    # plus special-token rows (id 0) with huge values that the caller leaves out of `rows`.
    ids, vals = [], []
    for t, row in zip(types, design):
        for off in (-0.4, 0.0, 0.4):
            ids.append(t)
            vals.append(row + off)
        ids.append(0)
        vals.append(np.full(3, 1e6))
    ids = np.array(ids)
    v = torch.tensor(np.stack(vals), dtype=torch.float32)
    hidden = torch.stack([torch.cat([v, torch.zeros(len(ids), 2)], 1),  # layer 0: dims 0..2 = design, 3..4 = 0
                          torch.cat([torch.zeros(len(ids), 2), -v], 1)])  # layer 1: dims 2..4 = -design
    valid = np.flatnonzero(ids != 0)
    chunks = [(ids[r], hidden[:, r]) for r in (valid[:7], valid[7:])]  # streamed in 2 chunks
    table = frequency_table(chunks, dims=[0, 1, 2, 4], freq_counts=freq, magnitude=False)
    # magnitude (the default, Puccetti et al.): dim 1 = −freq/10 ± 0.4 never changes sign, so its mean |h| is
    # +freq/10 and ρ flips from −1 to +1; the all-positive dims are unchanged
    mag = frequency_table(chunks, dims=[0, 1, 2, 4], freq_counts=freq)
    torch.testing.assert_close(mag.means[0, :, :3], torch.tensor(np.abs(design)), rtol=0, atol=1e-5)
    assert mag.rho[0, :3].tolist() == pytest.approx([1.0, 1.0, rho_expected])

    assert table.type_ids.tolist() == types.tolist() and table.occurrences.tolist() == [3] * 6
    assert table.freqs.tolist() == freq[types].tolist()
    torch.testing.assert_close(table.means[0, :, :3], torch.tensor(design), rtol=0, atol=1e-5)
    assert table.rho[0].tolist() == pytest.approx([1.0, -1.0, rho_expected, float("nan")], nan_ok=True)
    # layer 1: dim 2 holds -design[:, 0], dim 4 holds -design[:, 2]
    assert float(table.rho[1, 2]) == pytest.approx(-1.0) and float(table.rho[1, 3]) == pytest.approx(-rho_expected)
    assert rho_expected == pytest.approx(0.0857142857)  # the hand computation itself: 1 - 6·32/210


def test_pretraining_counts_come_from_the_run_config(tmp_path):
    from outlierlab.models.loading import FrozenEncoder
    from outlierlab.datamodules.token_counts import count_tokens, pretraining_counts
    from outlierlab.evaluation.analyses.frequency import run

    run_dir = tmp_path / "train_run"
    save_planted(run_dir / "hf")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n")
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text(
        OmegaConf.to_yaml({"data": {"source": "files", "files": [str(corpus)], "hub": None, "max_documents": None,
                                    "cache_dir": "${oc.env:NOPE_NOT_SET}"}, "run_dir": "${hydra:runtime.output_dir}"}))
    enc = FrozenEncoder(str(run_dir), device="cpu")
    counts, what = pretraining_counts(enc.source, enc.tokenizer, tmp_path / "cache")
    assert "pretraining corpus" in what and "files" in what
    expected = np.zeros(len(enc.tokenizer), dtype=np.int64)
    for line in CORPUS:
        for t in enc.tokenizer(line, add_special_tokens=False)["input_ids"]:
            expected[t] += 1
    assert np.array_equal(counts, expected)
    # by hand: byte-level BPE tells a line-initial "the" (3×) from " the" (Ġthe, 6×)
    the, gthe = (enc.tokenizer(w, add_special_tokens=False)["input_ids"] for w in ("the", " the"))
    assert len(the) == len(gthe) == 1 and counts[the[0]] == 3 and counts[gthe[0]] == 6
    assert np.array_equal(count_tokens(enc.tokenizer, CORPUS), expected)

    # through run(): auto -> the pretraining corpus; the planted dim is the LayerNorm outlier dim
    res = run(make_ctx("frequency", enc, tmp_path, {"plot_layers": [1, 3]}))
    assert res.summary["dims"] == [PLANTED_DIM]
    assert {r["counts_from"] for r in res.rows} == {what}
    assert [r["layer"] for r in res.rows] == [0, 1, 2, 3] and all(r["dim_source"] == "layernorm" for r in res.rows)
    assert res.figures[0].is_file()


def test_frequency_counts_on_eval_text_for_unknown_corpus(tmp_path):
    """An encoder that is not a train.py run: frequencies are counted on the evaluated text (said so)."""
    from outlierlab.models.loading import FrozenEncoder
    from outlierlab.evaluation.analyses.frequency import run

    enc = FrozenEncoder(str(save_planted(tmp_path / "model")), device="cpu")
    res = run(make_ctx("frequency", enc, tmp_path, {"dims": [1, PLANTED_DIM]}))
    assert all("evaluated text" in r["counts_from"] for r in res.rows)
    assert {(r["layer"], r["dim"]) for r in res.rows} == {(l, d) for l in range(4) for d in (1, PLANTED_DIM)}
    assert all(r["dim_source"] == "user" for r in res.rows)

    # the same numbers straight from the model: per non-special type, mean MAGNITUDE |h| of the dim (Puccetti et
    # al.); ρ with its count
    from scipy.stats import spearmanr

    texts = SENTENCES * 6
    b = enc.tokenizer(texts, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    with torch.no_grad():
        hs = enc.model.roberta(b["input_ids"], b["attention_mask"], output_hidden_states=True).hidden_states
    valid = (b["attention_mask"] == 1) & (b["special_tokens_mask"] == 0)
    ids, last = b["input_ids"][valid].numpy(), hs[-1][valid][:, PLANTED_DIM].numpy()
    types = np.unique(ids)
    count = np.array([(ids == t).sum() for t in types])
    mean = np.array([np.abs(last[ids == t]).mean() for t in types])
    row = next(r for r in res.rows if r["layer"] == 3 and r["dim"] == PLANTED_DIM)
    assert row["n_types"] == len(types)
    assert row["spearman"] == pytest.approx(spearmanr(count, mean).statistic, abs=1e-4)
    assert row["mean_value"] == pytest.approx(float(np.abs(last).mean()), rel=1e-4) and row["value"] == "magnitude"
    signed = run(make_ctx("frequency", enc, tmp_path, {"dims": [PLANTED_DIM], "value": "signed"}))
    srow = next(r for r in signed.rows if r["layer"] == 3)
    smean = np.array([last[ids == t].mean() for t in types])
    assert srow["spearman"] == pytest.approx(spearmanr(count, smean).statistic, abs=1e-4)
    assert srow["mean_value"] == pytest.approx(float(last.mean()), rel=1e-4)


# --------------------------------------------------------------------------------------- attention sinks
def test_sink_masses_hand_built_attention():
    from outlierlab.metrics.attention_mass import sink_masses
    from outlierlab.evaluation.analyses.attention_sinks import sink_rows

    bos, eos, pad = 0, 2, 1
    ids1 = torch.tensor([[0, 5, 6, 2], [0, 7, 2, 1]])
    mask1 = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    ids2 = torch.tensor([[0, 9, 2]])
    mask2 = torch.ones(1, 3, dtype=torch.long)
    # one layer, two heads. Head 0: every real query puts 0.5 on <s>, 0.25 on </s>; the PAD query (row 1, q 3)
    # puts 1.0 on <s> and must not count. Head 1: uniform over the real keys.
    a1 = torch.zeros(2, 2, 4, 4)
    a1[0, 0] = torch.tensor([0.5, 0.125, 0.125, 0.25]).expand(4, 4)
    a1[1, 0, :3] = torch.tensor([0.5, 0.25, 0.25, 0.0])
    a1[1, 0, 3] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    a1[0, 1] = 0.25
    a1[1, 1, :, :3] = 1 / 3
    a2 = torch.zeros(1, 2, 3, 3)
    a2[0, 0] = torch.tensor([0.5, 0.25, 0.25]).expand(3, 3)
    a2[0, 1] = 1 / 3
    attn = {id(ids1): (a1,), id(ids2): (a2,)}
    m = sink_masses(lambda ids, mask: attn[id(ids)], [(ids1, mask1), (ids2, mask2)], bos, eos)
    # 10 real queries: head 0 <s> = 0.5 everywhere; </s> = 0.25 (4 q) + 0.25 (3 q) + 0.25 (3 q) -> 0.25
    # head 1 <s> = (4·0.25 + 3/3 + 3/3) / 10 = 0.3; </s> = same
    assert m["bos"][0].tolist() == pytest.approx([0.5, 0.3])
    assert m["eos"][0].tolist() == pytest.approx([0.25, 0.3])
    assert m["special"][0].tolist() == pytest.approx([0.75, 0.6]) and m["bos"].shape == (1, 2)
    # entropy over the same 10 real queries: head 0 rows 1 and 3 are (0.5, 0.125, 0.125, 0.25) / (0.5, 0.25, 0.25);
    # head 1 is uniform over 4 (4 queries) or 3 keys (6 queries)
    h4 = -(0.5 * math.log(0.5) + 2 * 0.125 * math.log(0.125) + 0.25 * math.log(0.25))
    h3 = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert m["entropy"][0].tolist() == pytest.approx([(4 * h4 + 6 * h3) / 10, (4 * math.log(4) + 6 * math.log(3)) / 10])
    rows = sink_rows({"intact": m})
    assert [(r["layer"], r["head"]) for r in rows] == [(1, 0), (1, 1)] and rows[1]["special"] == pytest.approx(0.6)
    assert rows[0]["entropy"] == pytest.approx((4 * h4 + 6 * h3) / 10)


def test_attention_sinks_run_intact_vs_disabled(tmp_path):
    from outlierlab.metrics.attention_mass import special_key_masks, special_token_attention_mass
    from outlierlab.models.loading import FrozenEncoder
    from outlierlab.evaluation.analyses.attention_sinks import run

    enc = FrozenEncoder(str(save_planted(tmp_path / "model")), device="cpu")
    ctx = make_ctx("attention_sinks", enc, tmp_path, {"batch_size": 64}, text_lines=SENTENCES)
    before = {k: v.clone() for k, v in enc.model.state_dict().items()}
    res = run(ctx)
    rows = {(r["condition"], r["layer"], r["head"]): r for r in res.rows}
    assert {c for c, _, _ in rows} == {"intact", "outliers_disabled", "random_disabled"} and len(rows) == 3 * 3 * 2
    assert all(r["dims"] == str(PLANTED_DIM) for r in res.rows if r["condition"] == "outliers_disabled")
    assert all(len(r["dims"].split(";")) == 1 and r["dims"] != str(PLANTED_DIM)
               for r in res.rows if r["condition"] == "random_disabled")

    # intact rows equal the formula applied directly to the model's own attention (one batch)
    tok = enc.tokenizer
    b = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        att = torch.stack(enc.model(b["input_ids"], b["attention_mask"], output_attentions=True).attentions)
    keys = special_key_masks(b["input_ids"], tok.bos_token_id, tok.eos_token_id, b["attention_mask"])
    ref = special_token_attention_mass(att, keys, b["attention_mask"].bool())
    for l in range(3):
        for h in range(2):
            assert rows[("intact", l + 1, h)]["bos"] == pytest.approx(float(ref["bos"][l, h]), abs=1e-6)
            assert rows[("intact", l + 1, h)]["eos"] == pytest.approx(float(ref["eos"][l, h]), abs=1e-6)
    # output LayerNorms act after block 1's attention: layer 1 is unchanged, later layers move
    for h in range(2):
        assert rows[("outliers_disabled", 1, h)]["bos"] == pytest.approx(rows[("intact", 1, h)]["bos"], abs=1e-6)
    assert max(abs(rows[("outliers_disabled", l, h)]["special"] - rows[("intact", l, h)]["special"])
               for l in (2, 3) for h in range(2)) > 1e-3
    assert all(torch.equal(v, before[k]) for k, v in enc.model.state_dict().items())
    assert res.figures[0].is_file()
    # per-layer sink-head shares (Gu et al. 2025) are the share of the rows' heads above 0.3
    for l in range(3):
        heads = [rows[("intact", l + 1, h)]["bos"] for h in range(2)]
        assert res.summary["sink_share_bos_intact"][l] == sum(v > 0.3 for v in heads) / 2

    # plots=false (a sweep): the same rows, no figure drawn and none listed
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    ctx = make_ctx("attention_sinks", enc, quiet, {"batch_size": 64}, text_lines=SENTENCES)
    ctx.plots = False
    res2 = run(ctx)
    assert repr(res2.rows) == repr(res.rows) and res2.figures == [] and not list((quiet / "run").glob("*.png"))
