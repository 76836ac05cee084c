"""Architecture switches against outliers: each switch against its equation, defaults unchanged,
the matrix of every (position scheme x switch) is tests/test_encoder_switch_matrix.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from outlierlab.lightning_modules.mlm_module import weight_decay_groups
from outlierlab.models import EncoderConfig, RobertaMaskedLM
from outlierlab.models.attention import HeadGate, SelfAttention, clipped_softmax
from outlierlab.models.blocks import Layer, OPLayer
from outlierlab.models.norms import NORM_TYPES, make_norm
from tests.encoder_fixtures import batch, cfg


# ------------------------------------------------------------------------------ defaults are today's model
def test_default_config_reproduces_the_pre_switch_model_bit_for_bit():
    """Keys and seeded values recorded with the encoder before the switches existed (commit 519346b):
    the long runs' checkpoints load, and a seed gives the same model."""
    torch.manual_seed(0)
    c = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_len=12)
    model = RobertaMaskedLM(c).eval()
    sd = model.state_dict()
    layer = ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
             "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"]
    expected = ["roberta.embeddings.word_embeddings.weight", "roberta.embeddings.position_embeddings.weight",
                "roberta.embeddings.LayerNorm.weight", "roberta.embeddings.LayerNorm.bias"]
    for i in range(2):
        expected += [f"roberta.encoder.layer.{i}.{m}.{p}" for m in layer for p in ("weight", "bias")]
    expected += ["lm_head.bias", "lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
                 "lm_head.layer_norm.bias"]
    assert list(sd) == expected
    assert sum(float(v.double().sum()) for v in sd.values()) == pytest.approx(95.05044295258267, abs=1e-9)
    assert sum(float(v.double().abs().sum()) for v in sd.values()) == pytest.approx(181.38655413483502, abs=1e-9)
    logits = model(torch.arange(3, 13).view(1, 10)).logits[0, :2, :4]
    ref = torch.tensor([[0.060073088854551315, 0.0, 0.06228316202759743, 0.010320691391825676],
                        [-0.08210498839616776, 0.0, -0.029538406059145927, 0.09604256600141525]])
    assert torch.allclose(logits, ref, atol=1e-6)
    assert c.is_plain_roberta


def test_config_saved_before_the_switches_loads_with_defaults():
    old = {k: v for k, v in cfg().to_dict().items() if k not in ("norm_placement", "norm", "attention", "block",
                                                                  "clip_gamma", "clip_zeta", "gate", "gate_hidden",
                                                                  "gate_bias_init", "op_beta",
                                                                  "op_beta_trainable")}
    assert EncoderConfig.from_dict(old) == cfg()


@pytest.mark.parametrize("key,value,match", [
    ("attention", "clipped", "unknown model.attention 'clipped'; valid: softmax, clipped_softmax, gated"),
    ("norm", "batchnorm", "unknown model.norm 'batchnorm'"),
    ("clip_zeta", -1.0, "clip_zeta > clip_gamma"),
])
def test_bad_switch_is_a_one_line_error(key, value, match):
    with pytest.raises(ValueError, match=match):
        cfg(**{key: value})


def test_op_block_refuses_pre_norm_placement():
    with pytest.raises(ValueError, match="norm_placement=pre does not apply"):
        cfg(block="op", norm_placement="pre")


def test_arch_config_group_states_the_dataclass_defaults(compose_cfg):
    model = compose_cfg("train", []).model
    for key, value in cfg().to_dict().items():
        if key in ("norm_placement", "norm", "attention", "block", "clip_gamma", "clip_zeta", "gate",
                   "gate_hidden", "gate_bias_init", "op_beta", "op_beta_trainable", "vocab_multiple"):
            assert model[key] == value, key


# ------------------------------------------------------------------------------ clipped softmax
def test_clipped_softmax_at_a_large_gamma_switches_attention_off_and_gets_no_gradient():
    """What the emergence_cpu sweep measured (docs/emergence.md): with small initial logits attention is
    near uniform (p ~ 1/T); if -gamma/(zeta-gamma) >= 1/T every probability is clipped to exactly 0, and the
    queries and keys get exactly zero gradient, so attention never switches on. Below that threshold it does."""
    ids = torch.randint(5, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    grads = {}
    for gamma in (-0.2, -0.05):  # threshold 0.167 / 0.048 vs 1/T = 0.083
        torch.manual_seed(0)
        model = RobertaMaskedLM(cfg(attention="clipped_softmax", clip_gamma=gamma))
        out = model.roberta(ids, torch.ones_like(ids), output_attentions=True)
        model(ids, torch.ones_like(ids), labels=ids).loss.backward()
        sa = model.roberta.encoder.layer[0].attention.self
        grads[gamma] = (float(torch.stack(out.attentions).detach().sum(-1).mean()), float(sa.query.weight.grad.abs().sum()))
    assert grads[-0.2] == (0.0, 0.0)  # all off, no gradient to W_Q
    assert grads[-0.05][0] > 0.3 and grads[-0.05][1] > 0


def test_clipped_softmax_is_softmax_at_gamma0_zeta1():
    s = torch.randn(4, 7, 7, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.allclose(clipped_softmax(s, 0.0, 1.0), s.softmax(-1), atol=1e-7)


def test_clipped_softmax_gives_exact_zeros_and_ones():
    # softmax([ln 8, 0, 0]) = [0.8, 0.1, 0.1]; softmax([0, 0]) = [0.5, 0.5]
    s = torch.tensor([[math.log(8.0), 0.0, 0.0]])
    # γ=-0.25, ζ=1.5: 1.75·0.8-0.25 = 1.15 -> 1 exactly; 1.75·0.1-0.25 = -0.075 -> 0 exactly
    out = clipped_softmax(s, -0.25, 1.5)
    assert out.tolist() == [[1.0, 0.0, 0.0]]
    # γ=-0.25, ζ=1.25: 1.5·0.8-0.25 = 0.95 stays; the 0.1s clip to 0
    assert torch.allclose(clipped_softmax(s, -0.25, 1.25), torch.tensor([[0.95, 0.0, 0.0]]), atol=1e-6)
    assert clipped_softmax(torch.zeros(1, 2), -0.25, 1.25).tolist() == [[0.5, 0.5]]


def test_clipped_softmax_rows_have_finite_gradients_and_clipped_rows_none():
    s = torch.tensor([[math.log(8.0), 0.0, 0.0], [0.3, -0.2, 0.1]], requires_grad=True)
    w = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    (clipped_softmax(s, -0.25, 1.5) * w).sum().backward()
    assert torch.isfinite(s.grad).all()
    assert s.grad[0].abs().max() == 0  # every entry of row 0 is clipped: nothing pulls its logits further
    assert s.grad[1].abs().max() > 0


def test_clipped_softmax_attention_with_padding_trains_with_finite_gradients():
    model = RobertaMaskedLM(cfg(attention="clipped_softmax", clip_gamma=-0.1, pos={"name": "alibi"}))
    ids, mask = batch()
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) < 0.3, ids, -100)
    model(ids, mask, labels).loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # padded keys get exactly zero weight: γ·1 + (ζ-γ)·0 < 0 clips to 0
    probs = model(ids, mask, output_attentions=True).attentions[0]
    assert probs[1, :, :, 7:].abs().max() == 0


# ------------------------------------------------------------------------------ gated attention
@pytest.mark.parametrize("gate", ["linear", "mlp", "all_heads_linear"])
def test_gated_attention_with_open_gates_equals_ungated(gate):
    torch.manual_seed(0)
    plain = RobertaMaskedLM(cfg(pos={"name": "rope"})).eval()
    gated = RobertaMaskedLM(cfg(pos={"name": "rope"}, attention="gated", gate=gate, gate_bias_init=40.0)).eval()
    missing, unexpected = gated.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(".gate." in k for k in missing)
    ids, mask = batch()
    a, b = plain(ids, mask).logits, gated(ids, mask).logits
    assert (a - b)[mask.bool()].abs().max() <= 1e-5
    # and a closed gate silences every head: the attention sublayer then adds only its output bias
    with torch.no_grad():
        for layer in gated.roberta.encoder.layer:
            layer.attention.self.gate.bias.fill_(-40.0)
    attn = gated.roberta.encoder.layer[0].attention.self
    x = torch.randn(2, 5, 16)
    ctx, _ = attn(x, torch.zeros(2, 1, 1, 5), torch.arange(5).expand(2, 5))
    assert ctx.abs().max() < 1e-12


@pytest.mark.parametrize("gate", ["linear", "mlp", "all_heads_linear"])
def test_gates_lie_strictly_between_zero_and_one_and_start_at_sigmoid_of_the_bias(gate):
    torch.manual_seed(0)
    g = HeadGate(cfg(attention="gated", gate=gate, gate_bias_init=-1.0))
    x = torch.randn(3, 6, 16) * 5
    vals = g(x)
    assert vals.shape == (3, 2, 6, 1)
    assert (vals > 0).all() and (vals < 1).all()
    with torch.no_grad():
        g.weight.zero_()
    assert torch.allclose(g(x), torch.full_like(vals, torch.sigmoid(torch.tensor(-1.0)).item()))


def test_linear_gate_reads_only_its_heads_slice():
    """Bondarenko et al.'s per-head linear gate: head h's gate depends on x[h·d_h:(h+1)·d_h] only."""
    torch.manual_seed(0)
    g = HeadGate(cfg(attention="gated", gate="linear"))
    x = torch.randn(1, 4, 16)
    y = x.clone()
    y[..., 8:] += 3.0  # change head 1's slice only
    assert torch.equal(g.logits(x)[:, 0], g.logits(y)[:, 0])
    assert not torch.allclose(g.logits(x)[:, 1], g.logits(y)[:, 1])


def test_gate_defaults_are_bondarenkos_bert_recipe():
    """Their BERT script: a per-head MLP gate of width d_h // 4 (their code), initial gate 0.5."""
    c = cfg(attention="gated", hidden_size=64, num_heads=2)  # d_h = 32 -> 8 hidden units
    gate = HeadGate(c)
    assert gate.kind == "mlp" and tuple(gate.hidden_weight.shape) == (2, 32, 8)
    assert torch.allclose(gate(torch.randn(1, 3, 64) * 0), torch.full((1, 2, 3, 1), 0.5))
    assert tuple(HeadGate(cfg(attention="gated", gate_hidden=5)).hidden_weight.shape) == (2, 8, 5)


# ------------------------------------------------------------------------------ norms
def test_noaffine_layernorm_has_no_parameters():
    assert list(make_norm("layernorm_noaffine", 8, 1e-5).parameters()) == []
    model = RobertaMaskedLM(cfg(norm="layernorm_noaffine"))
    lns = model.named_layernorms()
    assert set(lns) == {"embeddings"} | {f"layer.{i}.{k}" for i in range(2) for k in ("attention_output", "output")}
    assert all(m.weight is None and m.bias is None for m in lns.values())
    # the only LayerNorm parameters left are the MLM head's
    assert [k for k in model.state_dict() if "LayerNorm" in k or "layer_norm" in k] == \
        ["lm_head.layer_norm.weight", "lm_head.layer_norm.bias"]


def test_rmsnorm_matches_its_formula_on_a_hand_vector():
    norm = make_norm("rmsnorm", 4, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 1.0, 2.0, 0.5]))
    # mean(x²) = (1+4+9+16)/4 = 7.5; rms = sqrt(7.5 + 1e-5)
    rms = math.sqrt(7.5 + 1e-5)
    expected = torch.tensor([1 / rms, 2 / rms, 2 * 3 / rms, 0.5 * 4 / rms])
    assert torch.allclose(norm(torch.tensor([1.0, 2.0, 3.0, 4.0])), expected, atol=1e-6)


def _attention_by_hand(x, sa, ln=None):
    """softmax(QKᵀ/√d) V per head, no positions, written out."""
    B, T, d = x.shape
    H, Dh = sa.num_heads, sa.head_dim
    q = F.linear(x, sa.query.weight, sa.query.bias).view(B, T, H, Dh).transpose(1, 2)
    k = F.linear(x, sa.key.weight, sa.key.bias).view(B, T, H, Dh).transpose(1, 2)
    v = F.linear(x, sa.value.weight, sa.value.bias).view(B, T, H, Dh).transpose(1, 2)
    if ln is not None:
        q, k = ln(q), ln(k)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(Dh), dim=-1)
    return (a @ v).transpose(1, 2).reshape(B, T, d)


def _ln(x, m):
    return F.layer_norm(x, (x.shape[-1],), m.weight, m.bias, m.eps)


def _perturb(module):
    torch.manual_seed(3)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.2)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_post_and_pre_ln_blocks_against_a_hand_written_forward(placement):
    c = cfg(pos={"name": "none"}, norm_placement=placement)
    torch.manual_seed(0)
    layer = Layer(c).eval()
    _perturb(layer)
    x = torch.randn(2, 5, 16)
    out, _ = layer(x, torch.zeros(2, 1, 1, 5), torch.arange(5).expand(2, 5))
    ao, o = layer.attention.output, layer.output
    ffn = lambda h: F.linear(F.gelu(F.linear(h, layer.intermediate.dense.weight, layer.intermediate.dense.bias)),  # noqa: E731
                             o.dense.weight, o.dense.bias)
    attn = lambda h: F.linear(_attention_by_hand(h, layer.attention.self), ao.dense.weight, ao.dense.bias)  # noqa: E731
    if placement == "post":
        h = _ln(x + attn(x), ao.LayerNorm)
        expected = _ln(h + ffn(h), o.LayerNorm)
    else:
        h = x + attn(_ln(x, ao.LayerNorm))
        expected = h + ffn(_ln(h, o.LayerNorm))
    assert torch.allclose(out, expected, atol=1e-5)


def test_pre_ln_encoder_has_a_final_layernorm_and_same_parameters_otherwise():
    post, pre = RobertaMaskedLM(cfg()), RobertaMaskedLM(cfg(norm_placement="pre"))
    extra = set(pre.state_dict()) - set(post.state_dict())
    assert extra == {"roberta.encoder.LayerNorm.weight", "roberta.encoder.LayerNorm.bias"}
    assert set(post.state_dict()) <= set(pre.state_dict())
    assert list(pre.named_layernorms())[-1] == "final"
    ids, mask = batch()
    out = pre.roberta(ids, mask, output_hidden_states=True)
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    row = out.last_hidden_state[0, 0].detach()  # the final LN's output: zero mean, unit variance at init gains
    assert abs(float(row.mean())) < 1e-5 and float(row.var(unbiased=False)) == pytest.approx(1.0, abs=1e-3)


# ------------------------------------------------------------------------------ Outlier-Protected block
def test_op_block_has_no_norm_in_its_residual_branches():
    model = RobertaMaskedLM(cfg(block="op"))
    layer = model.roberta.encoder.layer[0]
    assert isinstance(layer, OPLayer)
    norms = {n for n, m in layer.named_modules() if isinstance(m, NORM_TYPES)}
    assert norms == {"attention.self.query_norm", "attention.self.key_norm"}  # QK-norm only
    assert list(model.named_layernorms()) == ["embeddings"]
    assert layer.attention.output.LayerNorm is None and layer.output.LayerNorm is None
    # QK-norm is RMSNorm with a gain whatever model.norm is (He et al.'s qk_norm_type), no bias
    assert isinstance(layer.attention.self.query_norm, nn.RMSNorm)
    assert isinstance(OPLayer(cfg(block="op", norm="layernorm_noaffine")).attention.self.key_norm, nn.RMSNorm)


def test_op_beta_follows_the_depth_rule_and_is_fixed_unless_asked():
    """He et al.'s configuration: β = 0.2 at 12 layers, O(1/√depth); fixed (trainable gains are their option)."""
    for layers, expected in [(12, 0.2), (3, 0.4), (4, 0.2 * math.sqrt(3))]:
        layer = RobertaMaskedLM(cfg(block="op", num_layers=layers)).roberta.encoder.layer[0]
        assert float(layer.attention_beta) == pytest.approx(expected) == float(layer.output_beta)
        assert "attention_beta" not in dict(layer.named_parameters())  # a buffer: no gradient, no optimizer
        assert "attention_beta" in layer.state_dict()  # ... but saved with the model
    assert float(OPLayer(cfg(block="op", op_beta=0.05)).output_beta) == pytest.approx(0.05)
    model = RobertaMaskedLM(cfg(block="op", op_beta_trainable=True))
    beta = model.roberta.encoder.layer[1].output_beta
    assert isinstance(beta, nn.Parameter) and beta.requires_grad
    decayed = {id(p) for p in weight_decay_groups(model)[0]["params"]}
    assert id(beta) not in decayed and id(model.roberta.encoder.layer[1].output.dense.weight) in decayed


def test_op_block_matches_its_equations_on_a_small_input():
    c = cfg(block="op", pos={"name": "none"}, op_beta=0.3)
    torch.manual_seed(0)
    layer = OPLayer(c).eval()
    _perturb(layer)
    x = torch.randn(2, 5, 16) * 4  # an unnormalised stream
    out, _ = layer(x, torch.zeros(2, 1, 1, 5), torch.arange(5).expand(2, 5))
    sa, ao, o = layer.attention.self, layer.attention.output, layer.output
    # QK-norm: RMSNorm per head over d_h, each with its own (perturbed) gain
    B, T, H, Dh = 2, 5, 2, 8

    def rms(t, m):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + m.eps) * m.weight

    q = rms(F.linear(x, sa.query.weight, sa.query.bias).view(B, T, H, Dh).transpose(1, 2), sa.query_norm)
    k = rms(F.linear(x, sa.key.weight, sa.key.bias).view(B, T, H, Dh).transpose(1, 2), sa.key_norm)
    v = F.linear(x, sa.value.weight, sa.value.bias).view(B, T, H, Dh).transpose(1, 2)
    mha = (torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(Dh), -1) @ v).transpose(1, 2).reshape(B, T, 16)
    h = x + layer.attention_beta * F.linear(mha, ao.dense.weight, ao.dense.bias)
    ffn = F.linear(F.gelu(F.linear(h, layer.intermediate.dense.weight, layer.intermediate.dense.bias)),
                   o.dense.weight, o.dense.bias)
    expected = h + layer.output_beta * ffn
    assert torch.allclose(out, expected, atol=1e-5)


# ------------------------------------------------------------------------------ sites
def test_sites_name_the_bondarenko_activations():
    from outlierlab.models.hook_points import site_table
    from outlierlab.models.sites import monitor_sites

    model = RobertaMaskedLM(cfg())
    post, table = model.roberta.encoder.layer[0], site_table(model)
    sites = {key: table[name] for key, name in monitor_sites(model).items()}
    assert sites["ffn_output", 1].module is post.output.dense
    assert (sites["ln_output", 1].module, sites["ln_output", 1].where) == (post.output.LayerNorm, "output")
    model = RobertaMaskedLM(cfg(block="op"))
    op, table = model.roberta.encoder.layer[0], site_table(model)
    sites = {key: table[name] for key, name in monitor_sites(model).items()}
    assert ("ln_output", 1) not in sites and sites["ffn_output", 1].module is op.output.dense
