"""The frequent-token heuristic of last-layer outlier dims as Macocco et al. (2025) compute it, on planted heads
and a Zipf vocabulary; and both analyses end to end through evaluate.py."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from outlierlab.metrics.frequent_token_logits import frequency_spearman, lin_coeff, macocco_outlier_dims, split_logits
from outlierlab.evaluation.analyses.frequent_tokens import late_labels, score_conditions



def _g(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------ frequent tokens
def _planted_head(vocab=200, dim=256, planted=5, n=400):
    """Positions whose dim ``planted`` is large and positive (an outlier), and an output layer whose column
    ``planted`` is log-frequency while every other column is noise unrelated to frequency."""
    freqs = (10_000 / torch.arange(1, vocab + 1, dtype=torch.float64)).round().to(torch.int64)  # Zipf, distinct
    weight = torch.randn(vocab, dim, generator=_g(0), dtype=torch.float64) * 0.3
    weight[:, planted] = freqs.double().log()
    h = torch.randn(n, dim, generator=_g(1), dtype=torch.float64)
    h[:, planted] = 10.0 + 0.5 * torch.randn(n, generator=_g(2), dtype=torch.float64)
    labels = torch.randint(vocab, (n,), generator=_g(3))
    return h, labels, weight, freqs, planted


def test_macocco_rule_finds_the_planted_dim_and_the_split_adds_up():
    h, _, weight, _, planted = _planted_head()
    assert macocco_outlier_dims(h) == [planted]
    bias = torch.randn(weight.shape[0], generator=_g(4), dtype=torch.float64)
    only, rest = split_logits(h, weight, [planted], bias)
    assert torch.allclose(only + rest, h @ weight.T + bias, atol=1e-9)
    assert torch.allclose(only, h[:, [planted]] @ weight[:, [planted]].T, atol=1e-12)  # h[:, S] W[S, :]


def test_logits_of_the_planted_dim_alone_rank_tokens_by_frequency_and_dropping_it_removes_that():
    h, labels, weight, freqs, planted = _planted_head()
    rows = score_conditions(h, labels, weight, None, {"macocco": [planted]}, freqs, n_random=3, seed=0,
                            min_count=1)
    by = {(r["rule"], r["condition"]): r for r in rows}
    only, without = by[("macocco", "only")], by[("macocco", "without")]
    assert only["logprob_spearman"] == pytest.approx(1.0, abs=1e-12)  # the dim's logits ARE log-frequency
    assert abs(without["logprob_spearman"]) < 0.25  # without it: noise unrelated to frequency
    # the dim alone always predicts the most frequent token: one predicted token, nothing to correlate —
    # reported as such (NaN and a status), not as 0 (Macocco et al.'s code writes 0 there)
    assert only["n_tokens"] == 1 and only["lin_status"] == "one token"
    assert math.isnan(only["spearman"]) and math.isnan(only["slope"])
    assert without["n_tokens"] > 20 and without["lin_status"] == "ok"
    assert abs(by[("macocco", "random_only")]["logprob_spearman"]) < 0.3
    assert by[("macocco", "random_only")]["n_draws"] == 3
    # the full model is the reference: KL 0 to itself, and the planted dim dominates it (dropping it moves far)
    assert by[("model", "full")]["kl"] == pytest.approx(0.0, abs=1e-9)
    assert without["kl"] > by[("macocco", "random_without")]["kl"]


def _zipf(vocab=1000):
    return (10_000 / torch.arange(1, vocab + 1, dtype=torch.float64)).round().to(torch.int64)


def test_zipf_case_of_the_issue_gives_macoccos_negative_rho_and_slope_where_every_token_gave_plus():
    """A condition predicting only the 30 most frequent tokens, more often the rarer they are."""
    freqs = _zipf()
    pred = torch.zeros(1000, dtype=torch.int64)
    pred[:30] = torch.arange(1, 31)  # token of rank r predicted r times
    lc = lin_coeff(freqs, pred)
    f = freqs[:30].double().numpy() / float(freqs.sum())
    g = np.arange(1, 31) / float(pred.sum())
    assert lc.status == "ok" and lc.n_tokens == 30 and lc.n_correlated == 30
    assert lc.spearman == pytest.approx(-1.0)  # strictly decreasing: ρ = −1 by definition
    assert lc.slope == pytest.approx(np.polyfit(f, g, 1)[0], rel=1e-10)  # least squares by hand (NumPy)
    assert lc.slope < 0
    # the old measure, over every counted token with the 970 never-predicted ones tied at 0: the sign flips
    assert frequency_spearman(freqs, pred.double()) > 0.15


def test_zipf_condition_through_the_head_sampled_gives_rho_near_minus_one():
    """The same case through logits and argmax: each position predicts token r with probability ∝ r."""
    freqs, vocab, n = _zipf(), 1000, 4000
    gen = _g(7)
    target = torch.multinomial(torch.arange(1, 31, dtype=torch.float64), n, replacement=True, generator=gen)
    h = torch.nn.functional.one_hot(target, 30).double() * 5.0  # h_d = 5 on the predicted token's dim
    weight = torch.zeros(vocab, 30, dtype=torch.float64)
    weight[:30] = torch.eye(30, dtype=torch.float64)  # token r's logit = h_r: the argmax is the target
    rows = score_conditions(h, target, weight, None, {}, freqs, n_random=0, seed=0, min_count=1)
    full = rows[0]
    counts = torch.bincount(target, minlength=vocab)
    assert full["n_tokens"] == 30 and full["top1"] == 1.0
    ref = stats.spearmanr(freqs[:30].numpy(), counts[:30].numpy())[0]
    assert full["spearman"] == pytest.approx(ref) and full["spearman"] == pytest.approx(-0.992, abs=1e-3)
    assert full["slope"] == pytest.approx(stats.linregress(freqs[:30].numpy() / float(freqs.sum()),
                                                           counts[:30].numpy() / n).slope)


def test_a_condition_that_never_predicts_a_counted_token_is_reported_as_such():
    freqs = torch.tensor([5, 3, 0, 0])
    assert lin_coeff(freqs, torch.tensor([0, 0, 4, 1])).status == "no prediction"
    assert lin_coeff(freqs, torch.zeros(4, dtype=torch.int64)).status == "no prediction"
    lc = lin_coeff(freqs, torch.tensor([2, 2, 1, 0]))
    assert lc.status == "constant" and math.isnan(lc.spearman) and lc.slope == pytest.approx(0.0)
    assert lc.n_tokens == 3 and lc.n_correlated == 2


def test_random_controls_avoid_both_macocco_sets_and_the_unembedding_rule_reads_the_weight_rows():
    vocab, d = 50, 64
    weight = torch.randn(vocab, d, generator=_g(8), dtype=torch.float64) * 0.1
    weight[:, 9] = 5.0 + 0.1 * torch.randn(vocab, generator=_g(9), dtype=torch.float64)
    assert macocco_outlier_dims(weight) == [9]
    h = torch.randn(200, d, generator=_g(10), dtype=torch.float64)
    sets = {"macocco": [3], "unembedding": [9], "argmax_share": [3, 4]}
    rows = score_conditions(h, torch.zeros(200, dtype=torch.long), weight, None, sets, torch.ones(vocab), n_random=40,
                            seed=0, min_count=1)
    for r in rows:
        if r["condition"].startswith("random"):
            drawn = {int(x) for draw in r["dims"].split("|") for x in draw.split(";")}
            assert not drawn & ({3, 9} | set(sets[r["rule"]])), r["rule"]  # own dims and both Macocco sets
            assert r["rule"] != "argmax_share" or not drawn & {4}
            assert len(drawn) > 10  # 40 draws spread over the allowed dims


def test_macocco_rule_takes_numpys_median_of_an_even_number_of_rows():
    """Their outlier_dims_quantile: np.quantile(|X|, 0.5, axis=0) — the mean of the two middle values, where
    torch.median would take the lower one."""
    h = torch.full((4, 200), 0.5, dtype=torch.float64)
    h[:, 0] = torch.tensor([0.0, 0.0, 2.0, 2.0])  # median 1.0 (torch.median: 0.0)
    assert float(np.quantile(h.abs().numpy(), 0.99)) == 0.5  # 796 of the 800 |h| are 0.5
    assert float(h[:, 0].median()) == 0.0  # the lower middle value: would miss the dim
    assert macocco_outlier_dims(h) == [0]


def test_late_position_protocol_keeps_one_label_per_long_enough_sequence():
    labels = torch.tensor([[5, 6, 7, 8, -100], [1, 2, -100, -100, -100], [3, 4, 5, 6, 7]])
    batches, skipped = late_labels([{"input_ids": labels.clamp_min(0), "labels": labels}], 3)
    kept = batches[0]["labels"]
    assert skipped == 1 and (kept != -100).sum() == 2
    assert kept[0, 3] == 8 and kept[2, 3] == 6 and (kept[1] == -100).all()


# ------------------------------------------------------------------------------------- the two analyses
@pytest.mark.slow
def test_frequent_tokens_and_qk_outliers_run_on_our_model_and_a_hub_bert(tmp_path):
    from probe_fixtures import minilm_path
    from ablation_fixtures import make_ctx, save_planted
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    def save_tiny_bert_mlm(directory):  # a hub-style BERT WITH its masked-LM head (random weights)
        torch.manual_seed(0)
        tok = AutoTokenizer.from_pretrained(minilm_path())
        cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)
        BertForMaskedLM(cfg).eval().save_pretrained(directory)
        tok.save_pretrained(directory)
        return directory

    from outlierlab.evaluation.analyses import frequent_tokens, qk_outliers
    from outlierlab.models.loading import FrozenEncoder

    for name, path in (("ours", save_planted(tmp_path / "ours")), ("bert", save_tiny_bert_mlm(tmp_path / "bert"))):
        enc = FrozenEncoder(str(path), device="cpu")
        ctx = make_ctx("frequent_tokens", enc, tmp_path, {"n_random": 2, "max_length": 64, "batch_size": 8,
                                                          "counts_from": "eval"})
        res = frequent_tokens.run(ctx)
        conds = {(r["rule"], r["condition"]) for r in res.rows}
        assert ("model", "full") in conds and ("model", "bias") in conds, name
        assert set(res.rows[0]) >= {c for c in frequent_tokens.COLUMNS if not c.endswith("_std")}
        assert {r["positions"] for r in res.rows} == {"masked"}
        full = next(r for r in res.rows if r["condition"] == "full")
        assert full["kl"] == pytest.approx(0.0, abs=1e-9) and full["n_positions"] > 10
        assert "## Last-layer outlier dims" in res.markdown and (ctx.out_dir / "frequent_tokens.png").is_file()
        if name == "ours":  # the planted output-LayerNorm dim 7 feeds the head: a rule must see *something*
            assert any(v for v in res.summary["dims"].values())
        ctx = make_ctx("qk_outliers", enc, tmp_path, {"max_sentences": 20})
        res = qk_outliers.run(ctx)
        cfg = enc.model.config
        heads = getattr(cfg, "num_heads", None) or cfg.num_attention_heads
        layers = getattr(cfg, "num_layers", None) or cfg.num_hidden_layers
        assert len(res.rows) == layers * cfg.hidden_size and {r["head"] for r in res.rows} == set(range(heads))
        assert res.summary["rotary"] is False and "no pair named" in res.markdown
    # plots=false (a sweep): the same rows, nothing drawn
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    for analysis, extra in ((frequent_tokens, {"n_random": 2, "max_length": 64, "batch_size": 8,
                                                "counts_from": "eval"}), (qk_outliers, {"max_sentences": 20})):
        name = analysis.__name__.rsplit(".", 1)[-1]
        drawn = analysis.run(make_ctx(name, enc, tmp_path, extra))
        ctx = make_ctx(name, enc, quiet, extra)
        ctx.plots = False
        res = analysis.run(ctx)
        assert repr(res.rows) == repr(drawn.rows) and res.figures == [] and drawn.figures, name  # NaN-safe
    assert not list((quiet / "run").glob("*.png"))


def test_a_decoder_is_scored_at_one_late_position_per_sequence_by_default(tmp_path):
    """Macocco et al.'s protocol (one late position per sequence) by default; positions=every as an option."""
    from family_models import build, save
    from ablation_fixtures import make_ctx

    from outlierlab.datamodules.scoring_batches import pack_texts
    from outlierlab.evaluation.analyses import frequent_tokens
    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder(str(save(*build("llama"), tmp_path / "llama")), device="cpu")
    common = {"n_random": 1, "max_length": 48, "batch_size": 8, "counts_from": "eval", "late_position": 30}
    late = frequent_tokens.run(make_ctx("frequent_tokens", enc, tmp_path, common))
    every = frequent_tokens.run(make_ctx("frequent_tokens", enc, tmp_path, {**common, "positions": "every"}))
    n_late, n_every = late.rows[0]["n_positions"], every.rows[0]["n_positions"]
    texts = (tmp_path / "text.txt").read_text().splitlines()
    packed = pack_texts(enc.tokenizer, texts, 48)
    long_enough = sum(len(enc.tokenizer(t, truncation=True, max_length=48)["input_ids"]) > 31 for t in packed)
    assert n_late == long_enough and 0 < n_late < n_every
    assert {r["positions"] for r in late.rows} == {"late"} and {r["positions"] for r in every.rows} == {"every"}
    assert "token 30 of each sequence" in late.markdown
    assert "unembedding" in late.summary["dims"]
    with pytest.raises(ValueError, match="no sequence reaches token 101"):
        frequent_tokens.run(make_ctx("frequent_tokens", enc, tmp_path, {**common, "late_position": 100}))
