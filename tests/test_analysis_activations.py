"""The modern outlier metrics: hand-computed kurtosis and max/median, streaming == one-shot, inf-norm sites
against a manual forward pass, planted attention sinks, planted position rows, the pooled share."""

import math

import pytest
import torch

from outlierlab.metrics.activations import ActivationAccumulator, activation_kurtosis, max_median_ratio
from outlierlab.metrics.attention_mass import (AttentionEntropyAccumulator, attention_entropy, attention_row_mass, sink_head_share,
                                special_token_attention_mass)
from outlierlab.metrics.outlier_dims import position_row_stats
from outlierlab.metrics.outlier_stats import OutlierAccumulator, pooled_share
from outlierlab.models import EncoderConfig, RobertaMaskedLM
from outlierlab.models.hook_points import site_table
from outlierlab.models.sites import InfNormRecorder, monitor_sites, monitored_forward


# ----------------------------------------------------------------------------------------------- kurtosis
def test_kurtosis_is_d_when_one_dim_holds_all_energy():
    d = 16
    x = torch.zeros(7, d)
    x[:, 5] = torch.randn(7) + 3.0
    assert activation_kurtosis(x).item() == pytest.approx(d, rel=1e-12)


def test_kurtosis_is_one_for_dims_of_equal_rms():
    # random signs, every entry ±2: every dim has RMS exactly 2
    x = 2.0 * torch.sign(torch.randn(50, 12))
    assert activation_kurtosis(x).item() == pytest.approx(1.0, abs=1e-12)


def test_kurtosis_hand_computed_three_dims():
    # tokens (1,2,2) and (1,0,2): mean squares m = (1, 2, 4); Kurt = mean(m²)/mean(m)² = 7 / (7/3)² = 9/7
    x = torch.tensor([[1.0, 2.0, 2.0], [1.0, 0.0, 2.0]])
    assert activation_kurtosis(x).item() == pytest.approx(9 / 7, rel=1e-12)


def test_kurtosis_mask_keeps_layer_axis_and_ignores_masked_tokens():
    x = torch.zeros(2, 1, 3, 3)  # [L, B, T, d]
    x[:, 0, 0] = torch.tensor([1.0, 2.0, 2.0])
    x[:, 0, 1] = torch.tensor([1.0, 0.0, 2.0])
    x[1, 0, 2] = torch.tensor([1000.0, 0.0, 0.0])  # masked out: must not count
    mask = torch.tensor([[True, True, False]])
    assert activation_kurtosis(x, mask).tolist() == pytest.approx([9 / 7, 9 / 7], rel=1e-12)


# ----------------------------------------------------------------------------------------------- max/median
def test_max_median_hand_computed():
    # token 1: |x| = (1, 2, 3, 10) -> max 10, median (2+3)/2 = 2.5 -> 4
    # token 2: |x| = (1, 1, 1, 4)  -> 4 / 1 = 4 ... make it differ: (2, 2, 2, -3) -> 3 / 2 = 1.5
    x = torch.tensor([[1.0, -2.0, 3.0, 10.0], [2.0, 2.0, 2.0, -3.0]])
    r = max_median_ratio(x)
    assert r["ratio"].item() == pytest.approx((4.0 + 1.5) / 2)
    assert r["max_abs"].item() == 10.0 and r["max_dim"].item() == 3 and r["max_token"].item() == 0


def test_max_median_odd_dim_uses_the_middle_value_and_reports_the_token():
    x = torch.tensor([[1.0, 1.0, 1.0], [-9.0, 3.0, 1.0]])  # ratios 1 and 9/3
    r = max_median_ratio(x)
    assert r["ratio"].item() == pytest.approx(2.0)
    assert (r["max_dim"].item(), r["max_token"].item()) == (0, 1)


# ------------------------------------------------------------------------------------ streaming == one-shot
def test_accumulator_equals_one_shot_over_batches():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 40, 8, generator=g)
    h[1, 17, 6] = 50.0  # the largest |x| of layer 1, token 17
    h[2, :, 2] += 4.0
    acc = ActivationAccumulator(3, 8)
    for part in h.split([5, 20, 15], dim=1):
        acc.update(part)
    one = max_median_ratio(h)
    assert torch.allclose(acc.kurtosis(), activation_kurtosis(h), rtol=1e-12)
    # against float64 squares: the float32 squares round at 6e-8 relative
    assert torch.allclose(acc.kurtosis(), activation_kurtosis(h.double()), rtol=1e-6)
    assert torch.allclose(acc.max_median(), one["ratio"], rtol=1e-12)
    assert torch.equal(acc.max_dim, one["max_dim"]) and torch.equal(acc.max_token, one["max_token"])
    assert (int(acc.max_dim[1]), int(acc.max_token[1])) == (6, 17)
    s = acc.summary()[2]
    assert s["abs_argmax_dim"] == 2 and s["abs_argmax_share"] > 0.5


def _accumulator_torch_formula(batches: list[torch.Tensor], eps: float = 1e-12) -> dict:
    """ActivationAccumulator's state written plainly with torch: Tensor.sort for
    the median, Tensor.max for each token's max |x| and its dim, scatter_add_ for the counts."""
    n_layers, d = batches[0].shape[0], batches[0].shape[-1]
    out = {"sum_sq": torch.zeros(n_layers, d, dtype=torch.float64), "ratio_sum": torch.zeros(n_layers, dtype=torch.float64),
           "abs_argmax_counts": torch.zeros(n_layers, d, dtype=torch.int64),
           "max_abs": torch.full((n_layers,), -1.0, dtype=torch.float64),
           "max_dim": torch.zeros(n_layers, dtype=torch.int64), "max_token": torch.zeros(n_layers, dtype=torch.int64)}
    seen = 0
    for x in batches:
        a = x.abs()
        srt = a.sort(-1).values
        median = 0.5 * (srt[..., (d - 1) // 2].double() + srt[..., d // 2].double())
        top, top_dim = a.max(-1)
        out["ratio_sum"] += (top.double() / median.clamp_min(eps)).sum(1)
        out["sum_sq"] += (a if a.dtype in (torch.float32, torch.float64) else a.float()).square().sum(
            -2, dtype=torch.float64)
        out["abs_argmax_counts"] += torch.zeros(n_layers, d, dtype=torch.int64).scatter_add_(
            1, top_dim, torch.ones_like(top_dim))
        best, tok = top.double().max(-1)
        better = best > out["max_abs"]
        out["max_abs"] = torch.where(better, best, out["max_abs"])
        out["max_dim"] = torch.where(better, top_dim.gather(1, tok[:, None])[:, 0], out["max_dim"])
        out["max_token"] = torch.where(better, tok + seen, out["max_token"])
        seen += x.shape[1]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("d", [1, 2, 7, 16])
def test_accumulator_equals_the_torch_formula_bitwise(dtype, d):
    """The numpy argmax / bincount / in-place squares give the previous torch formula's state bitwise:
    ties of |x| (x and -x), zero rows (median 0 -> eps), a NaN, a maximum equalled in a later batch."""
    g = torch.Generator().manual_seed(21)
    batches = []
    for n in (5, 1, 9):
        x = torch.randn(3, n, d, generator=g).round(decimals=1) * 4
        batches.append(x)
    batches[0][0, 0] = 0.0
    batches[0][1, 1, 0] = 9.0
    if d > 1:
        batches[0][1, 1, d - 1] = -9.0  # |x| tie: the first dim wins
        batches[2][2, 3, 1] = float("nan")
    batches[2][1, 4, 0] = 9.0  # equals the running max: not "better", the first token stays
    batches = [x.to(dtype) for x in batches]
    acc = ActivationAccumulator(3, d)
    for x in batches:
        acc.update(x.clone())
    ref = _accumulator_torch_formula(batches)
    for k, v in ref.items():
        got = getattr(acc, k)
        assert torch.equal(got.isnan(), v.isnan()) if v.is_floating_point() else True, k
        assert torch.equal(torch.nan_to_num(got, nan=-7.0), torch.nan_to_num(v, nan=-7.0)), k
    assert acc.n_tokens == 15
    one = max_median_ratio(batches[0])
    assert torch.equal(one["ratio"], _accumulator_torch_formula(batches[:1])["ratio_sum"] / 5)


def test_empty_accumulator_and_empty_mask_fail_clearly():
    with pytest.raises(ValueError, match="empty"):
        ActivationAccumulator(1, 4).kurtosis()
    with pytest.raises(ValueError, match="no token"):
        activation_kurtosis(torch.ones(1, 2, 4), torch.zeros(1, 2, dtype=torch.bool))


# ------------------------------------------------------------------------------------------ pooled share
def test_pooled_share_hand_computed_is_an_argmin_share_over_non_input_layers():
    # 3 hidden states (0 = embeddings), 4 tokens, d = 3; argmin dims per layer:
    # layer 0: all dim 0 (ignored); layer 1: dim 2,2,2,1; layer 2: dim 2,2,0,0 -> dim 2: 5 of 8 = 0.625
    mins = {0: [0, 0, 0, 0], 1: [2, 2, 2, 1], 2: [2, 2, 0, 0]}
    h = torch.zeros(3, 4, 3)
    for layer, dims in mins.items():
        for t, d in enumerate(dims):
            h[layer, t, d] = -1.0
    acc = OutlierAccumulator(3, 3)
    acc.update(h)
    assert acc.pooled_share("argmin") == (2, pytest.approx(0.625))
    # the per-layer maxima are 0.75 and 0.5; the pooled share is of ONE dim across layers
    assert acc.argmin_share()[1].max().item() == 0.75
    # counting the embedding output too would name another dim: dim 0 holds 4 + 2 of 12 minima
    assert pooled_share(acc.argmin_counts, 4, slice(0, None)) == (0, pytest.approx(0.5))


# ------------------------------------------------------------------------------------------- position rows
def test_position_rows_planted_argmax_and_sigma_dims():
    g = torch.Generator().manual_seed(1)
    table = torch.randn(40, 64, generator=g) * 0.1
    table[:30, 7] = 5.0    # dim 7 is the argmax of 30 of 40 rows (and 3σ in those rows)
    table[30:, 3] = 1.0    # the other rows' argmax is dim 3 ...
    table[35, 9] = 8.0     # ... except a single-row artefact: argmax of row 35 only
    table[:, 11] = -5.0    # dim 11 is every row's argmin
    st = position_row_stats(table)
    assert (st["argmax_dim"], st["argmax_share"]) == (7, 0.75)
    assert (st["argmin_dim"], st["argmin_share"]) == (11, 1.0)
    assert int(st["argmax"][35]) == 9
    assert st["sigma_row_share"][7].item() == pytest.approx(0.75) and st["sigma_dims"][:2] == [11, 7]
    assert bool(st["sigma_mask"][35, 9]) and st["sigma_row_share"][9].item() == pytest.approx(1 / 40)


# ------------------------------------------------------------------------------------------ attention sinks
def test_planted_attention_sinks_share_and_entropy():
    # 1 layer, 1 sequence of 4 tokens (<s> a b </s>), 4 heads
    T = 4
    attn = torch.zeros(1, 1, 4, T, T)
    attn[0, 0, 0, :, 0] = 1.0                        # head 0: everything on <s>  -> entropy 0
    attn[0, 0, 1] = 1.0 / T                          # head 1: uniform -> mass 0.25 on <s>, entropy log 4
    attn[0, 0, 2, :, 0], attn[0, 0, 2, :, 1] = 0.5, 0.5  # head 2: 0.5 on <s>, entropy log 2
    attn[0, 0, 3, :, 3] = 1.0                        # head 3: everything on </s>
    bos = torch.tensor([[True, False, False, False]])
    eos = torch.tensor([[False, False, False, True]])
    mass = special_token_attention_mass(attn, {"bos": bos, "eos": eos})
    assert mass["bos"][0].tolist() == pytest.approx([1.0, 0.25, 0.5, 0.0])
    assert sink_head_share(mass["bos"]).tolist() == [0.5]     # heads 0 and 2 exceed 0.3
    assert sink_head_share(mass["eos"]).tolist() == [0.25]    # head 3 (head 1's 0.25 does not)
    ent = attention_entropy(attn)
    assert ent[0].tolist() == pytest.approx([0.0, math.log(4), math.log(2), 0.0])
    acc = AttentionEntropyAccumulator((1, 4))
    acc.update(attn[:, :, :, :2], torch.ones(1, 2, dtype=torch.bool))
    acc.update(attn[:, :, :, 2:], torch.ones(1, 2, dtype=torch.bool))
    assert torch.allclose(acc.compute(), ent)


def test_entropy_ignores_padded_queries():
    attn = torch.zeros(1, 1, 2, 2)
    attn[0, 0, 0] = torch.tensor([0.5, 0.5])
    attn[0, 0, 1] = torch.tensor([1.0, 0.0])  # padded query: must not count
    assert attention_entropy(attn, torch.tensor([[True, False]])).item() == pytest.approx(math.log(2))


def test_row_mass_is_one_for_softmax_and_what_the_clipped_softmax_leaves():
    from outlierlab.models.attention import clipped_softmax

    scores = torch.zeros(1, 2, 3, 4)  # uniform rows: p = 0.25 everywhere
    scores[0, 1, 2] = torch.tensor([2.0, 0.0, 0.0, 0.0])  # one peaked row in head 1
    assert attention_row_mass(scores.softmax(-1)).tolist() == pytest.approx([1.0, 1.0])
    # gamma = -0.1: a uniform row keeps 4 x (1.1 x 0.25 - 0.1) = 0.7
    p = torch.exp(torch.tensor(2.0)) / (torch.exp(torch.tensor(2.0)) + 3)  # 0.711 on the peaked key
    peaked = (1.1 * p - 0.1) + 3 * (1.1 * (1 - p) / 3 - 0.1)
    mass = attention_row_mass(clipped_softmax(scores, -0.1, 1.0))
    assert mass.tolist() == pytest.approx([0.7, (0.7 + 0.7 + float(peaked)) / 3])
    # gamma = -0.5: 1.5 x 0.25 - 0.5 < 0, every uniform row is switched off; only the peaked key survives
    mass = attention_row_mass(clipped_softmax(scores, -0.5, 1.0), torch.tensor([[True, True, False]]))
    assert mass.tolist() == pytest.approx([0.0, 0.0])  # the peaked row is a padded query: not counted


# ---------------------------------------------------------------------------------------------- sites
def _tiny(**kw):
    cfg = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                        max_len=16, dropout=0.0, **kw)
    return RobertaMaskedLM(cfg).eval()


def test_inf_norm_sites_agree_with_a_manual_forward_pass():
    torch.manual_seed(0)
    model = _tiny()
    ids = torch.tensor([[0, 5, 6, 7, 2, 1], [0, 8, 9, 2, 1, 1]])
    mask = (ids != 1).long()
    with torch.no_grad():
        hidden, attn, inf = monitored_forward(model, ids, mask)
        # manual: re-run block by block from the embedding output
        from outlierlab.models.attention import position_ids_from_mask

        pos = position_ids_from_mask(mask)
        x = model.roberta.embeddings(ids, mask, pos)
        bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        real = mask.bool()
        for i, layer in enumerate(model.roberta.encoder.layer, start=1):
            ctx, _ = layer.attention.self(x, bias, pos)
            a = layer.attention.output(ctx, x)
            ffn = layer.output.dense(layer.intermediate(a))
            ln_in = ffn + a
            x = layer.output.LayerNorm(ln_in)
            assert inf["ffn_output"][i].item() == pytest.approx(ffn[real].abs().max().item(), rel=1e-6)
            assert inf["ln_input"][i].item() == pytest.approx(ln_in[real].abs().max().item(), rel=1e-6)
            assert inf["ln_output"][i].item() == pytest.approx(x[real].abs().max().item(), rel=1e-6)
            assert torch.allclose(hidden[i], x, atol=1e-5)
    assert math.isnan(inf["ffn_output"][0].item())  # the embedding output has no sites
    assert attn.shape == (2, 2, 2, 6, 6)


def test_padding_never_enters_the_inf_norm():
    model = _tiny()
    ids = torch.tensor([[0, 5, 2, 1]])
    mask = torch.tensor([[1, 1, 1, 0]])
    with InfNormRecorder(model.roberta) as rec, torch.no_grad():
        model.roberta(ids, mask)
        rec._pending[("ffn_output", 1)][0, 3] = 1e6  # a huge value at the padded position
        rec.commit(mask.bool())
    assert rec.result()["ffn_output"][1].item() < 1e6


def _block_sites(model, layer: int = 1) -> dict:
    """Block ``layer``'s monitor sites as ``{name: (module, "input" | "output")}``."""
    table = site_table(model)
    return {key: (table[name].module, table[name].where) for (key, i), name in monitor_sites(model).items()
            if i == layer}


def test_block_variants_declare_their_sites():
    op_model, pre_model = _tiny(block="op"), _tiny(norm_placement="pre")
    op, pre = op_model.roberta.encoder.layer[0], pre_model.roberta.encoder.layer[0]
    # the block output: the block itself (its output's first element is residual_out's)
    assert "ln_output" not in _block_sites(op_model) and _block_sites(op_model)["ln_input"] == (op, "output")
    assert _block_sites(pre_model)["ln_input"] == (pre, "output")
    with torch.no_grad():
        _, _, inf = monitored_forward(_tiny(block="op"), torch.tensor([[0, 5, 2]]), torch.ones(1, 3))
    assert math.isnan(inf["ln_output"][1].item()) and inf["ffn_output"][1].item() > 0


def test_hf_bert_sites_fallback_uses_module_names():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16)
    bert = transformers.BertModel(cfg).eval()
    sites = _block_sites(bert, 2)
    assert sites["ffn_output"][0] is bert.encoder.layer[1].output.dense
    ids = torch.tensor([[2, 5, 6, 3]])
    with InfNormRecorder(bert) as rec, torch.no_grad():
        out = bert(input_ids=ids, output_hidden_states=True)
        rec.commit(torch.ones(1, 4, dtype=torch.bool))
    # ln_output of block 2 is the last hidden state
    assert rec.result()["ln_output"][2].item() == pytest.approx(out.hidden_states[2].abs().max().item(), rel=1e-6)
