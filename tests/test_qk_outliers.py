"""Query/key outlier features of rotary positions (Jonasson 2025): planted pairs in our model, and the
frequencies, reach and read-out point of hub families (scaled RoPE, partial rotary, QK-norm)."""

import math

import pytest
import torch

from outlierlab.metrics.qk_magnitudes import RotarySpec, magnitude_outliers
from outlierlab.evaluation.analyses.qk_outliers import qk_rows
from outlierlab.models.qk_recorder import QKRecorder, rotary_specs
from outlierlab.models.config import EncoderConfig
from outlierlab.models.family_spec import QKProjection
from outlierlab.models.encoder import RobertaMaskedLM


def _g(seed):
    return torch.Generator().manual_seed(seed)



def _tiny(pos: str) -> RobertaMaskedLM:
    # head_dim 32: two equal outliers among n dims reach z = √((n-2)/2) at most, 3.9 > 3 here (2.6 with n = 16)
    cfg = EncoderConfig(vocab_size=60, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=64,
                        dropout=0.0, attention_dropout=0.0, max_len=64, pos={"name": pos})
    torch.manual_seed(0)
    return RobertaMaskedLM(cfg).eval()


def _plant_pair(model: RobertaMaskedLM, layer: int, head: int, pair: int) -> tuple[int, int]:
    """Large W_Q and W_K rows on the two dims of rotary pair ``pair`` of one head (half layout)."""
    hd = model.config.head_dim
    dims = (head * hd + pair, head * hd + pair + hd // 2)
    attn = model.roberta.encoder.layer[layer].attention.self
    with torch.no_grad():
        for lin in (attn.query, attn.key):
            lin.weight[list(dims)] = 4.0 * torch.randn(2, lin.weight.shape[1], generator=_g(5))
    return pair, pair + hd // 2


def _record(model: RobertaMaskedLM):
    rec = QKRecorder(model)
    ids = torch.randint(3, 60, (4, 20), generator=_g(6))
    mask = torch.ones_like(ids)
    mask[0, 15:] = 0
    with rec.hooked(), torch.no_grad():
        model(ids, mask)
        rec.observe(mask)
    return rec


def test_with_the_mask_given_first_each_layer_is_reduced_in_its_hook_to_the_same_numbers():
    """evaluate's path: no projections of finished layers held while the forward runs."""
    model = _tiny("rope")
    ref = _record(model)
    rec = QKRecorder(model)
    held = []
    update = rec.acc.update
    rec.acc.update = lambda *a: (held.append(len(rec._out)), update(*a))
    ids = torch.randint(3, 60, (4, 20), generator=_g(6))
    mask = torch.ones_like(ids)
    mask[0, 15:] = 0
    with rec.hooked(), torch.no_grad():
        rec.expect(mask)
        model(ids, mask)
        rec.observe(mask)
    assert held == [0, 0] and not rec._out  # each layer reduced before the next one ran
    for key, value in ref.acc.result().items():
        assert torch.equal(rec.acc.result()[key], value), key


def test_a_planted_rotary_pair_is_reported_with_its_frequency_and_dims():
    model = _tiny("rope")
    d0, d1 = _plant_pair(model, layer=1, head=1, pair=6)
    rec = _record(model)
    specs = rotary_specs(model, 2, model.config.head_dim, 1.0)
    assert specs[0].inv_freq == pytest.approx(RotarySpec.from_base(32, 32, 10000.0, 64).inv_freq, rel=1e-12)
    assert specs[0].context == 64 and specs[0].rotary_dim == 32 and specs[0].layout == "half"
    rows = qk_rows(rec.acc.result(), specs, k=3.0)
    flagged_q = {(r["layer"], r["head"], r["dim"]) for r in rows if r["q_outlier"]}
    flagged_k = {(r["layer"], r["head"], r["dim"]) for r in rows if r["k_outlier"]}
    assert {(1, 1, d0), (1, 1, d1)} <= flagged_q and {(1, 1, d0), (1, 1, d1)} <= flagged_k
    assert not any(layer == 1 and head == 1 and d not in (d0, d1) for layer, head, d in flagged_q)
    planted = [r for r in rows if (r["layer"], r["head"], r["dim"]) in {(1, 1, d0), (1, 1, d1)}]
    theta = 10000.0 ** (-2 * 6 / 32)
    for r in planted:
        assert r["rotary_pair"] == 6 and {r["dim"], r["partner_dim"]} == {d0, d1}
        assert r["theta"] == pytest.approx(theta) and r["cycles"] == pytest.approx(theta * 64 / (2 * math.pi))
        assert r["within_bound"] is (theta * 64 / (2 * math.pi) < 1.0)
    assert specs[0].first_partial_pair() == next(i for i in range(16) if 10000.0 ** (-2 * i / 32) * 64 < 2 * math.pi)


def test_no_rotary_scheme_names_no_pair():
    model = _tiny("learned")
    _plant_pair(model, layer=0, head=0, pair=3)
    rec = _record(model)
    specs = rotary_specs(model, 2, model.config.head_dim, 1.0)
    assert specs == [None, None]
    rows = qk_rows(rec.acc.result(), specs, k=3.0)
    assert {r["dim"] for r in rows if r["layer"] == 0 and r["head"] == 0 and r["q_outlier"]} == {3, 19}
    assert all(r["rotary_pair"] == "" and r["theta"] == "" for r in rows)


def test_pairs_of_both_layouts_and_the_outlier_rule():
    half, inter = RotarySpec.from_base(8, 8, 100.0, 32, "half"), RotarySpec.from_base(8, 6, 100.0, 32, "interleaved")
    assert [half.pair(d) for d in range(8)] == [(0, 4), (1, 5), (2, 6), (3, 7), (0, 0), (1, 1), (2, 2), (3, 3)]
    assert [inter.pair(d) for d in range(8)] == [(0, 1), (0, 0), (1, 3), (1, 2), (2, 5), (2, 4), None, None]
    mask, z = magnitude_outliers(torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0], [2.0] * 8]), 2.0)
    assert mask[0].tolist() == [False] * 7 + [True] and not mask[1].any() and float(z[1].abs().max()) == 0.0


def _record_hf(model, seed=11, T=24):
    rec = QKRecorder(model)
    ids = torch.randint(1000, 2000, (3, T), generator=_g(seed))
    mask = torch.ones_like(ids)
    with rec.hooked(), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        rec.observe(mask)
    return rec


LLAMA31 = dict(rope_type="llama3", rope_theta=500_000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=8192)


def test_llama31_scaled_rope_frequencies_are_the_models_inv_freq():
    """rope_type llama3, factor 8 (head_dim 64: 32 pairs) — 17 frequencies differ from rope_theta alone
    by up to 8x, and the first partial-cycle pair over T = 131072 is 20, not 25."""
    from family_models import build

    model, _ = build("llama", hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                     max_position_embeddings=131_072, rope_parameters=LLAMA31)
    specs = rotary_specs(model, 2, 64, 1.0)
    inv = model.model.rotary_emb.inv_freq.double()
    unscaled = RotarySpec.from_base(64, 64, 500_000.0, 131_072)
    for spec in specs:
        assert spec.inv_freq == tuple(inv.tolist()) and spec.context == 131_072 and spec.rotary_dim == 64
    differ = ~torch.isclose(inv, torch.tensor(unscaled.inv_freq, dtype=torch.float64), rtol=1e-4)
    assert int(differ.sum()) == 17
    assert max(u / t for u, t in zip(unscaled.inv_freq, spec.inv_freq)) == pytest.approx(8.0, rel=1e-6)
    expected = next(i for i in range(32) if float(inv[i]) * 131_072 / (2 * math.pi) < 1.0)
    assert specs[0].first_partial_pair() == expected == 20 and unscaled.first_partial_pair() == 25


def test_partial_rotary_and_modernbert_local_layers_use_their_own_frequencies_and_64_token_reach():
    from family_models import build

    neox, _ = build("gpt_neox", rotary_pct=0.25)
    spec = rotary_specs(neox, 2, 16, 1.0)[0]
    assert spec.rotary_dim == 4 and spec.inv_freq == tuple(neox.gpt_neox.rotary_emb.inv_freq.double().tolist())
    assert spec.pair(4) is None  # dims beyond r do not rotate
    bert, _ = build("modernbert", global_attn_every_n_layers=2, local_attention=128)
    assert bert.config.layer_types == ["full_attention", "sliding_attention"]
    full, local = rotary_specs(bert, 2, 16, 1.0)
    rot = bert.model.rotary_emb
    assert local.context == 64 and full.context == 512  # sliding_window = local_attention / 2: the reach
    assert local.inv_freq == tuple(rot.sliding_attention_inv_freq.double().tolist())
    assert full.inv_freq == tuple(rot.full_attention_inv_freq.double().tolist())
    assert local.inv_freq[1] == pytest.approx(10_000.0 ** (-2 / 16)) and full.inv_freq[1] == pytest.approx(
        160_000.0 ** (-2 / 16))
    mistral, _ = build("mistral", sliding_window=48)  # no layer types: the window holds in every layer
    assert [s.context for s in rotary_specs(mistral, 2, 16, 1.0)] == [48, 48]
    qwen, _ = build("qwen2", sliding_window=48, use_sliding_window=False)  # a window in the config, switched off
    assert [s.context for s in rotary_specs(qwen, 2, 16, 1.0)] == [512, 512]


def test_qwen3_qk_norm_gain_is_seen_because_q_and_k_are_read_after_it():
    """A q-norm gain of 25 planted on dim 40 — after the norm (where Qwen3 rotates q) every head of
    that layer flags it; at the projection (before the norm) no head does."""
    from family_models import build

    model, _ = build("qwen3", hidden_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=64)
    with torch.no_grad():
        model.model.layers[1].self_attn.q_norm.weight[40] = 25.0
    rec = _record_hf(model)
    assert rec.projs[1].q is model.model.layers[1].self_attn.q_norm and rec.projs[1].layout == "heads"
    rows = qk_rows(rec.acc.result(), rotary_specs(model, 2, 64, 1.0), k=3.0)
    assert {r["head"] for r in rows if r["layer"] == 1 and r["dim"] == 40 and r["q_outlier"]} == {0, 1}
    before = QKRecorder(model)
    before.projs = [QKProjection(b.self_attn.q_proj, b.self_attn.k_proj, "separate", 2, 2, 64)
                    for b in model.model.layers]
    with before.hooked(), torch.no_grad():
        ids = torch.randint(1000, 2000, (3, 24), generator=_g(11))
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
        before.observe(torch.ones_like(ids))
    rows = qk_rows(before.acc.result(), [None, None], k=3.0)
    assert not any(r["layer"] == 1 and r["dim"] == 40 and r["q_outlier"] for r in rows)


def test_our_op_block_is_read_after_its_query_norm():
    cfg = EncoderConfig(vocab_size=60, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=64, dropout=0.0,
                        attention_dropout=0.0, max_len=64, pos={"name": "rope"}, block="op")
    torch.manual_seed(0)
    model = RobertaMaskedLM(cfg).eval()
    attn = model.roberta.encoder.layer[0].attention.self
    with torch.no_grad():
        attn.query_norm.weight[5] = 25.0
    rec = _record(model)
    assert rec.projs[0].q is attn.query_norm and rec.projs[0].layout == "head_major"
    rows = qk_rows(rec.acc.result(), rotary_specs(model, 2, 32, 1.0), k=3.0)
    assert {r["head"] for r in rows if r["layer"] == 0 and r["dim"] == 5 and r["q_outlier"]} == {0, 1}


@pytest.mark.parametrize("model_type", ["qwen3", "modernbert", "gpt_neox", "olmo2"])
def test_qk_outliers_runs_on_hub_families_with_their_rotary_layers(tmp_path, model_type):
    """evaluate.py's qk_outliers on saved hub-format models: per-layer θ and reach in the CSV rows, the source
    of θ and the QK-norm reading point in the report."""
    from family_models import build, save
    from ablation_fixtures import make_ctx

    from outlierlab.evaluation.analyses import qk_outliers
    from outlierlab.models.loading import FrozenEncoder

    extra = {"global_attn_every_n_layers": 2} if model_type == "modernbert" else {}
    enc = FrozenEncoder(str(save(*build(model_type, **extra), tmp_path / model_type)), device="cpu")
    res = qk_outliers.run(make_ctx("qk_outliers", enc, tmp_path, {"max_sentences": 12}))
    assert res.summary["rotary"] is True and "inv_freq" in res.markdown
    if model_type == "qwen3":
        assert res.summary["qk_read_at"] == ["layers.0.self_attn.q_norm", "layers.0.self_attn.k_norm"]
        assert "after the QK-norm" in res.markdown
    if model_type == "olmo2":  # a QK-norm over the whole projection: read after it, and said so
        assert res.summary["qk_read_at"] == ["layers.0.self_attn.q_norm", "layers.0.self_attn.k_norm"]
        assert "after the QK-norm" in res.markdown and "no QK-norm" not in res.markdown
    if model_type == "gpt_neox":
        assert "no QK-norm in this model" in res.markdown
    rot = enc.model.rotary_emb  # the body (AutoModel) holds the rotary module in every family here
    by_layer = {}
    for r in res.rows:
        if r["rotary_pair"] != "":
            by_layer.setdefault(r["layer"], {})[r["rotary_pair"]] = (r["theta"], r["cycles"])
    if model_type == "modernbert":  # layer 1 is local: its own frequencies over a 64-token reach
        theta, cyc = by_layer[1][1]
        assert theta == pytest.approx(float(rot.sliding_attention_inv_freq[1])) and cyc == pytest.approx(
            theta * 64 / (2 * math.pi))
        assert by_layer[0][1][0] == pytest.approx(float(rot.full_attention_inv_freq[1]))
    else:
        assert by_layer[0][1][0] == pytest.approx(float(rot.inv_freq[1]))
