"""evaluate.py's outliers analysis: the modern metrics ride along the streaming pass on a real Hugging Face
encoder and equal the one-shot functions; position tables are read row by row."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from outlierlab.metrics.activations import activation_kurtosis, max_median_ratio
from outlierlab.evaluation.activation_pass import ActivationObserver
from outlierlab.evaluation.analyses.outliers import position_outliers
from outlierlab.evaluation.sentence_pass import pass_settings, run_sentence_pass
from tests.conftest import compose
from probe_fixtures import SENTENCES


def test_streaming_metrics_on_a_real_bert_equal_one_shot_values():
    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder("all-minilm-l6-v2", device="cpu")
    texts = list(SENTENCES)[:24]
    settings = pass_settings(compose("evaluate"))  # the YAML's values, an odd chunk on purpose
    settings["data"] = replace(settings["data"], chunk=7)
    obs = ActivationObserver(enc)  # the outliers analysis' subscriber, fed along the forward
    run_sentence_pass(enc, texts, ["none"], batch_size=5,
                      consumers=[obs], **settings)
    # one shot: every text in one padded batch
    hidden, valid, real = [], [], []
    for b in enc.encode(texts, batch_size=len(texts)):
        hidden.append(b.hidden), real.append(b.attention_mask.bool())
        valid.append(b.attention_mask.bool() & ~b.special_tokens_mask.bool())
    h, v, r = hidden[0], valid[0], real[0]
    assert torch.allclose(obs.acc.kurtosis(), activation_kurtosis(h, v), rtol=1e-5)
    assert torch.allclose(obs.acc.max_median(), max_median_ratio(h, v)["ratio"], rtol=1e-5)
    assert torch.allclose(obs.acc.max_abs, max_median_ratio(h, v)["max_abs"], rtol=1e-6)
    # BERT is post-LN: the last block's output-LayerNorm output is the last hidden state (all real tokens)
    inf = obs.recorder.result()
    assert inf["ln_output"][-1].item() == pytest.approx(h[-1][r].abs().max().item(), rel=1e-5)
    assert (inf["ln_input"][1:] > 0).all() and torch.isnan(inf["ffn_output"][0])
    assert obs.token_text(0) != ""  # the token holding the largest |x| is named
    # our hooks are removed after the pass (transformers keeps its own output-capturing ones)
    assert not [h for m in enc.model.modules() for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
                if h.__module__.startswith("outlierlab")]


def test_position_table_row_by_row_finds_a_planted_dim_the_mean_hides():
    from outlierlab.models import EncoderConfig, RobertaMaskedLM

    cfg = EncoderConfig(vocab_size=40, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_len=20)
    model = RobertaMaskedLM(cfg)
    emb = model.roberta.embeddings.position_embeddings
    table = emb.weight if isinstance(emb, torch.nn.Embedding) else next(
        m for m in emb.modules() if isinstance(m, torch.nn.Embedding)).weight
    with torch.no_grad():
        table[cfg.pad_token_id + 1:, 4] = torch.tensor([1.0, -1.0] * 10)  # alternating sign: mean ≈ 0
    pos = position_outliers(model)
    assert pos is not None and pos["rows"] == 20
    assert 4 not in pos["sigma_dims"]  # the averaged vector hides it ...
    assert (pos["by_row"]["argmax_dim"], pos["by_row"]["argmax_share"]) == (4, 0.5)  # ... rows show it
    assert pos["by_row"]["argmin_dim"] == 4 and 4 in pos["by_row"]["sigma_dims"]


def test_mean_norm_is_the_norm_of_the_mean_vector():
    """docs/tables.md's meaning of ``mean_norm``, computed by hand from the hidden states: ||mean of the non-special
    token vectors||, which on MiniLM is far below the mean of their norms (2.3 against 9.7 at the embeddings)."""
    import outlierlab as ol
    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder("all-minilm-l6-v2", device="cpu")
    texts = list(SENTENCES)
    rows = ol.evaluate(enc, texts, analyses=["outliers"], transforms=["none"], progress=False)["outliers"]
    (b,) = enc.encode(texts, batch_size=len(texts))
    valid = b.attention_mask.bool() & ~b.special_tokens_mask.bool()
    for layer, h in enumerate(b.hidden):
        x = h[valid].double()
        got = rows.loc[rows["layer"] == layer, "mean_norm"].item()
        assert got == pytest.approx(x.mean(0).norm().item(), rel=1e-5)
        assert got < 0.8 * x.norm(dim=1).mean().item()  # not the mean of the norms
