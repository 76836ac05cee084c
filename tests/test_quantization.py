"""W8A8 fake quantization (outlierlab.metrics.fake_quant, outlierlab.models.w8a8) and the ``quantization`` analysis:
the formula on hand cases, and what a planted outlier dimension costs in 8 bits."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from family_models import DECODERS, SPECS, build
from outlierlab.evaluation.analyses import quantization
from outlierlab.evaluation.analyses.quantization import quantization_rows
from outlierlab.metrics.fake_quant import absmax_scale, fake_quantize, fake_quantize_weight, largest_dims
from outlierlab.datamodules.scoring_batches import masked_batches, next_token_batches
from outlierlab.models.lm_model import LoadedModel
from outlierlab.models.w8a8 import KeptDims, linear_input_sites, linear_layers, quantized
from probe_fixtures import SENTENCES, byte_level_tokenizer

PLANTED = 7


def test_fake_quantize_is_round_of_x_over_absmax_by_127():
    x = torch.tensor([1.0, -0.3, 0.013, 2.54, -0.011])
    # scale = 2.54 / 127 = 0.02: 50, -15, round(0.65) = 1, 127, round(-0.55) = -1
    assert absmax_scale(x) == pytest.approx(0.02)
    assert torch.allclose(fake_quantize(x), torch.tensor([1.0, -0.3, 0.02, 2.54, -0.02]), atol=1e-6)
    # 4 bits: qmax 7, scale 2.54 / 7; 1.0 / s = 2.756 -> 3
    s = 2.54 / 7
    assert torch.allclose(fake_quantize(x, bits=4), torch.tensor([3 * s, -1 * s, 0.0, 2.54, 0.0]), atol=1e-6)
    # kept dims stay exact and leave the scale: 1.3 sets it (1.3 / 127), -0.7 -> round(-68.38) = -68
    y = torch.tensor([100.0, 1.3, -0.7])
    assert torch.allclose(fake_quantize(y, keep=torch.tensor([0])), torch.tensor([100.0, 1.3, -68 * 1.3 / 127]))
    assert torch.equal(fake_quantize(torch.zeros(4)), torch.zeros(4))


def test_weights_are_rounded_per_output_channel_and_clamped_at_127():
    w = torch.tensor([[1.0, 0.5, -0.26], [10.0, 3.3, -10.0]])
    q = fake_quantize_weight(w)
    # row 0: scale 1/127, 0.5*127 = 63.5 -> 64 (half to even), -0.26*127 = -33.02 -> -33
    assert torch.allclose(q[0], torch.tensor([1.0, 64 / 127, -33 / 127]))
    # row 1: scale 10/127: 3.3*12.7 = 41.91 -> 42; both ends exactly ±127 (never beyond)
    assert torch.allclose(q[1], torch.tensor([10.0, 42 * 10 / 127, -10.0]))
    assert torch.equal(largest_dims(torch.tensor([[0.1, -5.0, 2.0], [0.3, 1.0, -2.5]]), 2), torch.tensor([1, 2]))


def planted_mlm(plant: bool, seed: int = 0, scale: float = 60.0, placement: str = "post", block: str = "roberta"):
    """Our RobertaMaskedLM, 2 layers x 32; ``plant``: in every block, value dimension 7 scaled up by ``scale`` and
    the attention output's input column 7 down by as much -- the same function (attention is linear in its values),
    but the attention output projection now reads an input with one outlier dimension, as Bondarenko et al.'s
    attention outliers are: what 8 bits cost there is the outlier's alone."""
    from outlierlab.models import EncoderConfig, RobertaMaskedLM

    torch.manual_seed(seed)
    tok = byte_level_tokenizer()
    cfg = EncoderConfig(vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                        max_len=64, pos={"name": "learned"}, dropout=0.0, attention_dropout=0.0,
                        norm_placement=placement, block=block)
    model = RobertaMaskedLM(cfg).eval()
    with torch.no_grad():
        model.roberta.embeddings.word_embeddings.weight.normal_(0, 1)
        for m in model.roberta.encoder.modules():  # blocks whose outputs matter beside the residual stream
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0, m.in_features ** -0.5)
        for layer in model.roberta.encoder.layer if plant else ():
            value, out = layer.attention.self.value, layer.attention.output.dense
            value.weight[PLANTED] *= scale
            value.bias[PLANTED] *= scale
            out.weight[:, PLANTED] /= scale
    loaded = LoadedModel(model=model, tokenizer=tok, layernorms=model.named_layernorms(), kind="outlierlab",
                         name="planted" if plant else "plain", has_mlm_head=True, max_length=64)
    return loaded, masked_batches(tok, SENTENCES * 4, 64, 8, 0.15, seed=3)


def test_a_planted_outlier_dimension_costs_in_8_bits_and_keeping_it_removes_most_of_the_cost():
    planted, batches = planted_mlm(True)
    plain, plain_batches = planted_mlm(False)
    by = {(r["condition"], r["layers"]): r for r in quantization_rows(planted, batches, bits=8, keep=1)}
    base = {(r["condition"], r["layers"]): r for r in quantization_rows(plain, plain_batches, bits=8, keep=1)}
    cost, plain_cost = by["w8a8", "all"]["kl"], base["w8a8", "all"]["kl"]
    assert cost > 5 * plain_cost > 0, (cost, plain_cost)
    kept_cost = by["w8a8_keep", "all"]["kl"]
    assert 0 < kept_cost < 0.2 * cost, (kept_cost, cost)  # LLM.int8()'s decomposition removes most of it
    # the loss moves by the same token: more with the outlier, little once it is kept
    assert abs(by["w8a8", "all"]["delta_loss"]) > 2 * abs(by["w8a8_keep", "all"]["delta_loss"])
    # the same function in full precision: the cost is the outlier's alone
    assert by["full_precision", "all"]["loss"] == pytest.approx(base["full_precision", "all"]["loss"], abs=1e-4)
    # the dim kept is the planted one wherever it is the largest (the attention output's inputs: 2 of the 12)
    assert f"{PLANTED}:" in by["w8a8_keep", "all"]["most_kept"]
    # the rows: full precision first, the same masked tokens everywhere, one row per block and condition
    assert [k for k in by][:4] == [("full_precision", "all"), ("w8a8", "all"), ("w8a8", "1"), ("w8a8", "2")]
    assert len({r["n_masked"] for r in by.values()}) == 1 and by["full_precision", "all"]["delta_loss"] == 0.0
    assert by["full_precision", "all"]["kl"] == pytest.approx(0.0, abs=1e-9)


def test_quantized_restores_the_weights_exactly_and_counts_kept_dims():
    loaded, batches = planted_mlm(True)
    layers = linear_layers(loaded.model)
    assert len(layers) == 2 * 6 and sorted({k.split(".")[0] for k in layers}) == ["1", "2"]
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    weights = {k: m.weight.clone() for k, m in layers.items()}
    kept = KeptDims()
    with quantized(loaded.model, keep=2, kept=kept):
        changed = all(not torch.equal(m.weight, weights[k]) for k, m in layers.items())
        loaded.forward(batches[0]["input_ids"], batches[0]["attention_mask"])
    assert changed
    assert all(torch.equal(v, before[k]) for k, v in loaded.model.state_dict().items())
    assert kept.inputs == 12 and dict(kept.top(12))[PLANTED] >= 2 / 12


def test_a_model_without_an_lm_head_gets_the_relative_error_of_its_last_hidden_states():
    loaded, batches = planted_mlm(True)
    loaded.has_mlm_head = False
    batches = [{"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]} for b in batches]
    rows = quantization_rows(loaded, batches, keep=1, per_layer=False)
    assert [r["condition"] for r in rows] == ["full_precision", "w8a8", "w8a8_keep"]
    assert all(r["objective"] == "hidden_rel_error" and r["loss"] is None for r in rows)
    assert rows[0]["rel_error"] == 0.0 and rows[1]["rel_error"] > rows[2]["rel_error"] > 0


def test_evaluate_runs_the_analysis_and_writes_its_table(tmp_path):
    from outlierlab.evaluation.analyses.quantization import run
    from outlierlab.models.loading import FrozenEncoder
    from outlierlab.models import save_pretrained
    from ablation_fixtures import make_ctx

    loaded, _ = planted_mlm(True)
    save_pretrained(loaded.model, tmp_path / "model", tokenizer=loaded.tokenizer)
    enc = FrozenEncoder(str(tmp_path / "model"), device="cpu")
    ctx = make_ctx("quantization", enc, tmp_path, {"max_length": 64, "batch_size": 8, "keep": 1, "per_layer": False})
    res = run(ctx)
    assert [r["condition"] for r in res.rows] == ["full_precision", "w8a8", "w8a8_keep"]
    assert res.summary["w8a8_kl"] > res.summary["w8a8_keep_kl"] > 0
    assert "| w8a8 | all |" in res.markdown and "12 linear layers" in res.markdown


def test_the_monitor_records_what_8_bits_cost_on_its_batch():
    """HiddenStateTracker(w8a8=True): the W8A8 damage (KL from the full-precision predictions) on its fixed masked
    problem, larger with the planted outlier than without it, and mostly gone with the outlier dims kept."""
    from outlierlab.monitoring.hidden_state_tracker import HiddenStateTracker

    deltas = {}
    for plant in (True, False):
        loaded, _ = planted_mlm(plant)
        tracker = HiddenStateTracker(n_sequences=16, w8a8=True)
        tracker.tokenize(loaded.tokenizer, loaded.model, SENTENCES * 2)
        rows, summary = tracker.compute(loaded.model, step=7)
        got = {r[2]: r[4] for r in rows if r[1] == "model" and r[2].startswith("w8a8_")}
        assert set(got) == {"w8a8_loss_delta", "w8a8_kl", "w8a8_keep_loss_delta", "w8a8_keep_kl"} and got == {
            f"w8a8_{k}": v for k, v in summary["w8a8"].items()}
        deltas[plant] = got
    assert deltas[True]["w8a8_kl"] > 5 * deltas[False]["w8a8_kl"] > 0, deltas
    assert 0 < deltas[True]["w8a8_keep_kl"] < 0.2 * deltas[True]["w8a8_kl"], deltas


# ------------------------------------------------------------------- W8A8 through the named sites
@contextmanager
def pre_hook_w8a8(model, blocks=None, bits: int = 8, keep: int = 0, kept: KeptDims | None = None):
    """The reference: W8A8 as a forward pre-hook on every linear layer ``linear_layers`` finds (its input rounded per
    tensor, ``keep`` largest-|x| dims left out) and its weight rounded per output channel -- no sites involved."""
    layers, saved, handles = linear_layers(model, blocks), {}, []

    def quantize_input(module, args):
        x = args[0]
        dims = largest_dims(x, keep) if keep > 0 else None
        if kept is not None and dims is not None:
            kept.update(dims.tolist())
            kept.inputs += 1
        return (fake_quantize(x, bits, keep=dims), *args[1:])

    try:
        with torch.no_grad():
            for name, module in layers.items():
                saved[name] = module.weight.detach().clone()
                w = module.weight
                w.copy_(fake_quantize_weight(w.t(), bits).t() if type(module).__name__ == "Conv1D" else
                        fake_quantize_weight(w, bits))
                handles.append(module.register_forward_pre_hook(quantize_input))
        yield
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for name, w in saved.items():
                layers[name].weight.copy_(w)


def _loaded(kind: str):
    """A stand-in of every family (and ours: post-LN with a planted outlier, pre-LN, Outlier-Protected) with its
    scored batches."""
    if kind.startswith("ours"):
        placement, block = {"ours-post": ("post", "roberta"), "ours-pre": ("pre", "roberta"),
                            "ours-op": ("post", "op")}[kind]
        return planted_mlm(True, placement=placement, block=block)
    model, tok = build(kind)
    decoder = kind in DECODERS
    loaded = LoadedModel(model=model, tokenizer=tok, layernorms={}, kind="hf", name=kind, has_mlm_head=True,
                         max_length=64, objective="next_token" if decoder else "masked_lm")
    batches = (next_token_batches(tok, SENTENCES, 64, 4) if decoder else
               masked_batches(tok, SENTENCES, 64, 4, 0.15, seed=3))
    return loaded, batches


FAMILIES = [*(t for t in SPECS if t != "albert"), "ours-post", "ours-pre", "ours-op"]


@pytest.mark.parametrize("kind", FAMILIES)
def test_w8a8_through_the_sites_gives_the_pre_hook_paths_numbers_and_quantizes_every_block_linear(kind, monkeypatch):
    """quantization_rows with the inputs rounded at the named sites equals, to the bit, the same rows with a
    forward pre-hook on every linear layer (the whole model and each block alone, with and without LLM.int8()'s kept
    dims and their counts); the sites feed exactly the linears ``linear_layers`` finds by type."""
    loaded, batches = _loaded(kind)
    for blocks in (None, [1], [2]):
        sites = linear_input_sites(loaded.model, blocks)
        quantized_here = {id(m) for s in sites.values() for m in (s.module, *s.also)}
        assert quantized_here == {id(m) for m in linear_layers(loaded.model, blocks).values()}, blocks
    through_sites = quantization_rows(loaded, batches, bits=8, keep=2)
    monkeypatch.setattr(quantization, "quantized", pre_hook_w8a8)
    by_pre_hooks = quantization_rows(loaded, batches, bits=8, keep=2)
    assert through_sites == by_pre_hooks
    # W8A8 moved the loss (the rows compare something), and the kept dims were counted
    assert len(through_sites) == 7 and through_sites[1]["delta_loss"] != 0 and through_sites[4]["most_kept"]


def test_a_block_linear_at_no_site_is_refused_in_one_line():
    loaded, batches = planted_mlm(True)
    loaded.model.roberta.encoder.layer[1].extra = torch.nn.Linear(32, 32)
    with pytest.raises(ValueError, match=r"^the linear layers 2\.extra of RobertaMaskedLM read no named site") as e:
        with quantized(loaded.model):
            pass
    assert "\n" not in str(e.value)


def test_an_adapted_linear_is_quantized_at_its_site_with_the_linears_it_wraps():
    """PEFT's LoRA wraps a projection (base layer, lora_A, lora_B): the wrapper's input is the site, every linear it
    holds has its weight rounded (and restored), so the quantized linears are still all of ``linear_layers``'."""
    peft = pytest.importorskip("peft")
    from outlierlab.models.w8a8 import site_linears

    loaded, batches = planted_mlm(True)
    model = peft.get_peft_model(loaded.model, peft.LoraConfig(r=2, target_modules=["query", "value"])).base_model.model
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # an adapter that changes the output
    sites = linear_input_sites(model)
    assert {id(m) for m in site_linears(sites.values())} == {id(m) for m in linear_layers(model).values()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, mask = batches[0]["input_ids"], batches[0]["attention_mask"]
    with torch.no_grad():
        full = model(ids, mask).logits
        with quantized(model, keep=1):
            rounded = model(ids, mask).logits
    assert not torch.equal(full, rounded)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
