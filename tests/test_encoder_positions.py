"""Position schemes: the properties each scheme promises, checked on numbers."""

import math

import pytest
import torch

from outlierlab.models import POSITION_SCHEMES, EncoderConfig, RobertaMaskedLM
from outlierlab.models.positions import alibi_slopes, sinusoidal_table
from outlierlab.configuration.overrides import group_options


def tiny(pos: str, **kw) -> RobertaMaskedLM:
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                        max_len=24, pos={"name": pos, **kw})
    return RobertaMaskedLM(cfg).eval()


def test_registry_matches_config_files():
    assert sorted(POSITION_SCHEMES) == group_options("pos")


@pytest.mark.parametrize("pos", ["none", "learned", "sinusoidal", "relative", "rope", "alibi"])
def test_only_none_is_permutation_equivariant(pos):
    """Without positions self-attention is permutation-equivariant: permuting the input tokens
    permutes every hidden state and logit. Every scheme that carries position must break it."""
    model = tiny(pos)
    with torch.no_grad():  # at init (std 0.02) relative vectors barely move the logits; make them count
        for name, p in model.named_parameters():
            if "distance_embedding" in name or name.endswith(("query.weight", "key.weight")):
                p.normal_(0, 0.5)
    ids = torch.randint(5, 50, (1, 12))
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(3))
    out = model(ids, output_hidden_states=True)
    out_p = model(ids[:, perm], output_hidden_states=True)
    diff = max((a[:, perm] - b).abs().max().item() for a, b in zip(out.hidden_states, out_p.hidden_states))
    diff = max(diff, (out.logits[:, perm] - out_p.logits).abs().max().item())
    if pos == "none":
        assert diff < 1e-5
    else:
        assert diff > 1e-3


@pytest.mark.parametrize("pos", ["relative", "rope", "alibi"])
def test_relative_schemes_scores_depend_only_on_offset(pos):
    """With identical content at every position, the attention logits of a relative scheme form
    a Toeplitz matrix (a function of i - j only) that is not constant."""
    model = tiny(pos, **({"max_distance": 4} if pos == "relative" else {}))
    attn = model.roberta.encoder.layer[0].attention.self
    x = torch.randn(1, 1, 32).expand(1, 10, 32)
    q, k, bias = attn._qk(x, torch.arange(10).expand(1, 10))  # the scaled pre-softmax scores incl. position bias
    s = (q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim) + (0 if bias is None else bias))[0]  # [H, T, T]
    for i in range(9):
        for j in range(9):
            assert torch.allclose(s[:, i, j], s[:, i + 1, j + 1], atol=1e-5)
    assert (s[:, 0, :] - s[:, 0, :1]).abs().max() > 1e-3  # offsets matter


@pytest.mark.parametrize("pos", ["relative", "rope", "alibi"])
def test_relative_schemes_invariant_to_shifting_positions(pos):
    """For arbitrary q, k the position contribution is unchanged when every position shifts by s."""
    model = tiny(pos)
    scheme = model.roberta.encoder.layer[1].attention.self.position_scheme
    q, k = torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    pos_ids = torch.arange(7).expand(2, 7)

    def scores(p):
        q2, k2, bias = scheme(q, k, p)
        return q2 @ k2.transpose(-1, -2) + (0 if bias is None else bias / (1 / math.sqrt(8)))

    assert torch.allclose(scores(pos_ids), scores(pos_ids + 5), atol=1e-4)


def test_relative_clips_at_max_distance():
    model = tiny("relative", max_distance=2)
    scheme = model.roberta.encoder.layer[0].attention.self.position_scheme
    q = k = torch.randn(1, 1, 1, 8).expand(1, 4, 8, 8)
    _, _, bias = scheme(q, k, torch.arange(8)[None])
    # offsets 3..7 all clip to 2 (and -3..-7 to -2): identical bias
    assert torch.allclose(bias[0, :, 7, 4], bias[0, :, 7, 0])
    assert torch.allclose(bias[0, :, 0, 3], bias[0, :, 0, 7])
    assert not torch.allclose(bias[0, :, 7, 6], bias[0, :, 7, 4])  # offset 1 vs clipped 2


def test_rope_rotation_is_norm_preserving_and_relative():
    model = tiny("rope")
    scheme = model.roberta.encoder.layer[0].attention.self.position_scheme
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    rq, _, _ = scheme(q, k, torch.tensor([[7]]))
    assert torch.allclose(rq.norm(), q.norm(), atol=1e-5)
    a = (scheme(q, k, torch.tensor([[3]]))[0] * scheme(q, k, torch.tensor([[1]]))[1]).sum()
    b = (scheme(q, k, torch.tensor([[12]]))[0] * scheme(q, k, torch.tensor([[10]]))[1]).sum()
    assert torch.allclose(a, b, atol=1e-5)


def test_alibi_slopes_and_bias_values():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -i for i in range(1, 9)]))
    model = tiny("alibi")
    scheme = model.roberta.encoder.layer[0].attention.self.position_scheme
    q = k = torch.zeros(1, 4, 5, 8)
    _, _, bias = scheme(q, k, torch.arange(5)[None])
    # 4 heads: slopes 2^-2, 2^-4, 2^-6, 2^-8; |0 - 3| = 3
    assert bias[0, 0, 0, 3].item() == pytest.approx(-3 * 0.25)
    assert bias[0, 1, 4, 1].item() == pytest.approx(-3 * 2 ** -4)


def test_sinusoidal_scale_matches_the_token_embeddings_or_is_what_is_asked():
    def table(**pos):
        c = EncoderConfig(vocab_size=50, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=32,
                          max_len=32, pos={"name": "sinusoidal", **pos})
        return RobertaMaskedLM(c).roberta.embeddings.position_embeddings.table

    raw = sinusoidal_table(32, 64)
    assert torch.equal(table(), raw)  # a config saved before the option: the raw table, as it was trained
    assert torch.equal(table(scale=1.0), raw)
    matched = table(scale="match_tokens")
    assert torch.allclose(matched, raw * 0.02 * math.sqrt(2))
    # RMS over a long table ~ the token embeddings' initial std 0.02 (unit-amplitude sin/cos have RMS 1/sqrt 2)
    assert float(sinusoidal_table(512, 64).pow(2).mean().sqrt()) * 0.02 * math.sqrt(2) == pytest.approx(0.02, rel=0.02)
    with pytest.raises(ValueError, match="pos.scale must be a number or 'match_tokens'"):
        table(scale="big")


def test_sinusoidal_matches_closed_form():
    t = sinusoidal_table(10, 4)
    assert t[0].tolist() == pytest.approx([0.0, 1.0, 0.0, 1.0])
    assert t[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-6)  # 0.841471
    assert t[1, 1].item() == pytest.approx(math.cos(1.0), abs=1e-6)  # 0.540302
    assert t[2, 2].item() == pytest.approx(math.sin(2 / 100.0), abs=1e-6)  # 10000^(2/4) = 100
    assert t[3, 3].item() == pytest.approx(math.cos(3 / 100.0), abs=1e-6)


def test_learned_positions_follow_roberta_convention():
    """Token t of a row uses table row padding_idx + 1 + t; padding uses row padding_idx."""
    model = tiny("learned")
    emb = model.roberta.embeddings.position_embeddings
    assert emb.num_embeddings == 24 + 2
    mask = torch.tensor([[1, 1, 1, 0]])
    got = emb(torch.tensor([[0, 1, 2, 0]]), mask)
    assert torch.equal(got[0, 0], emb.weight[2]) and torch.equal(got[0, 2], emb.weight[4])
    assert torch.equal(got[0, 3], torch.zeros(32))  # padding row is zero


def test_padding_does_not_change_real_tokens():
    for pos in POSITION_SCHEMES:
        model = tiny(pos)
        ids = torch.randint(5, 50, (1, 6))
        padded = torch.cat([ids, torch.ones(1, 4, dtype=torch.long)], 1)
        mask = (padded != model.config.pad_token_id).long()  # as transformers: no mask means no padding
        a = model(ids).logits
        b = model(padded, mask).logits[:, :6]
        assert torch.allclose(a, b, atol=1e-5), pos


def test_too_long_sequence_is_a_clear_error():
    model = tiny("learned")
    with pytest.raises(ValueError, match="exceeds the model's max_len=24"):
        model(torch.randint(5, 50, (1, 25)))


def test_unknown_scheme_lists_valid_names():
    with pytest.raises(ValueError, match="valid: alibi, learned, none, relative, rope, sinusoidal"):
        EncoderConfig(pos={"name": "nope"}) and RobertaMaskedLM(EncoderConfig(pos={"name": "nope"}))


def test_layernorms_tracked_are_the_roberta_ones():
    names = list(tiny("none").named_layernorms())
    assert names == ["embeddings", "layer.0.attention_output", "layer.0.output",
                     "layer.1.attention_output", "layer.1.output"]
