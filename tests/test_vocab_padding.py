"""model.vocab_multiple pads the token embedding (and the tied LM head) to a GPU-friendly size and changes no
number: the padded classes' logits are -inf, so loss and gradients equal the unpadded model's, the padded rows
get no gradient, the logits returned are the tokenizer's vocabulary, and exports hold no padded row."""

from __future__ import annotations

import pytest
import torch

from outlierlab.models import EncoderConfig, RobertaMaskedLM
from outlierlab.models.export import load_pretrained, save_pretrained

V = 50  # a vocabulary no multiple of 64 rounds to itself: padded to 64


def tiny(vocab_multiple: int, causal: bool = False) -> RobertaMaskedLM:
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_len=24,
                        dropout=0.0, attention_dropout=0.0, causal=causal, vocab_multiple=vocab_multiple)
    return RobertaMaskedLM(cfg).double()


def pair(causal: bool = False) -> tuple[RobertaMaskedLM, RobertaMaskedLM]:
    """An unpadded model and the padded one holding the same weights (the padded rows as initialised)."""
    plain, padded = tiny(1, causal), tiny(64, causal)
    state = plain.state_dict()
    emb = "roberta.embeddings.word_embeddings.weight"
    with torch.no_grad():
        padded.roberta.embeddings.word_embeddings.weight[:V] = state.pop(emb)
    padded.load_state_dict(state, strict=False)
    return plain, padded


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (3, 16), generator=g)
    labels = torch.where(torch.rand(3, 16, generator=g) < 0.3, torch.randint(5, V, (3, 16), generator=g), -100)
    labels[0, 3] = 7
    return ids, labels


@pytest.mark.parametrize("vocab, multiple, rows", [(50, 64, 64), (64, 64, 64), (50265, 64, 50304), (50, 1, 50),
                                                   (50257, 64, 50304)])
def test_padded_size_is_the_next_multiple(vocab, multiple, rows):
    assert EncoderConfig(vocab_size=vocab, vocab_multiple=multiple).padded_vocab_size == rows


def test_a_multiple_below_one_is_refused():
    with pytest.raises(ValueError, match=r"model\.vocab_multiple must be >= 1"):
        EncoderConfig(vocab_multiple=0)


@pytest.mark.parametrize("key, value, message", [
    ("vocab_multiple", "abc", "model.vocab_multiple must be an integer, got 'abc'"),  # was: '<' not supported ...
    ("vocab_multiple", 2.5, "model.vocab_multiple must be an integer, got 2.5"),
    ("vocab_multiple", True, "model.vocab_multiple must be an integer, got True"),
    ("hidden_size", "abc", "model.hidden_size must be an integer, got 'abc'"),  # was: not all arguments converted ...
    ("dropout", "x", "model.dropout must be a number, got 'x'"),
    ("causal", "no", "model.causal must be true or false, got 'no'"),  # was: a causal decoder ('no' is true)
])
def test_a_value_of_the_wrong_type_is_refused_naming_its_key(key, value, message):
    # what Hydra hands over for model.vocab_multiple=abc: the string, unchecked by the dataclass
    with pytest.raises(ValueError) as e:
        EncoderConfig(**{key: value})
    assert str(e.value) == message
    assert EncoderConfig(gate_hidden=None, op_beta=1, dropout=0).op_beta == 1  # None where allowed; an int is a number


@pytest.mark.slow
@pytest.mark.parametrize("value, message", [
    ("abc", "model.vocab_multiple must be an integer, got 'abc'"),
    ("0", "model.vocab_multiple must be >= 1 (1: no padding; 64 on a GPU), got 0"),
])
def test_train_py_refuses_a_bad_multiple_in_one_line(tmp_path, value, message):
    from tests.run_fixtures import cli, one_error
    from tests.run_fixtures import SMALL

    r = cli("train.py", [f"hydra.run.dir={tmp_path}", *SMALL, f"model.vocab_multiple={value}", "trainer.max_steps=2"])
    assert r.returncode == 1 and one_error(r.stderr).startswith(f"error: {message}")


@pytest.mark.parametrize("causal, full_logits", [(False, False), (False, True), (True, False)],
                         ids=["mlm-masked-head", "mlm-full-head", "clm"])
def test_loss_and_gradients_equal_the_unpadded_model(causal, full_logits):
    ids, labels = batch()
    plain, padded = pair(causal)
    assert padded.roberta.embeddings.word_embeddings.weight.shape[0] == 64
    a = plain(ids, labels=labels, full_logits=full_logits)
    b = padded(ids, labels=labels, full_logits=full_logits)
    assert b.logits.shape == a.logits.shape and b.logits.shape[-1] == V  # the real vocabulary only
    torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(b.loss, a.loss, rtol=0, atol=1e-12)
    a.loss.backward()
    b.loss.backward()
    grads_a = {n: p.grad for n, p in plain.named_parameters()}
    for name, p in padded.named_parameters():
        g = p.grad[:V] if name.endswith("word_embeddings.weight") else p.grad
        torch.testing.assert_close(g, grads_a[name], rtol=0, atol=1e-12, msg=name)
    # the padded rows are never an input and never predicted: not one gradient reaches them
    assert torch.count_nonzero(padded.roberta.embeddings.word_embeddings.weight.grad[V:]) == 0


def test_scored_rows_without_labels_are_the_real_vocabulary():
    ids, _ = batch()
    plain, padded = pair()
    pos = torch.tensor([1, 5, 20])
    out = padded(ids, masked_positions=pos)
    assert out.logits.shape == (3, V) and torch.isfinite(out.logits).all()
    torch.testing.assert_close(out.logits, plain(ids, masked_positions=pos).logits, rtol=0, atol=1e-12)


@pytest.mark.parametrize("fmt", ["hf", "outlierlab"])
def test_exports_drop_the_padded_rows(tmp_path, fmt):
    ids, _ = batch()
    _, padded = pair()
    padded = padded.float()
    assert save_pretrained(padded, tmp_path, format=fmt) == fmt
    loaded = load_pretrained(tmp_path)
    assert loaded.config.vocab_multiple == 1 and loaded.config.vocab_size == V
    assert loaded.roberta.embeddings.word_embeddings.weight.shape[0] == V
    torch.testing.assert_close(loaded(ids).logits, padded(ids).logits, rtol=1e-5, atol=1e-5)
