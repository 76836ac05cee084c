"""Export to / import from Hugging Face format, and our own format for the other schemes."""

import json

import pytest
import torch

from outlierlab.models import EncoderConfig, RobertaMaskedLM, load_pretrained, save_pretrained


def trained_looking(pos: str) -> RobertaMaskedLM:
    """A model whose LayerNorms/biases are not at their init values, so a mapping slip shows."""
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                        max_len=16, pos={"name": pos})
    model = RobertaMaskedLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def batch():
    ids = torch.randint(5, 60, (3, 12), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = 0
    ids[1, 8:] = 1  # right padding
    return ids, (ids != 1).long()


@pytest.mark.parametrize("pos", ["learned", "none"])
def test_hf_round_trip_logits_and_hidden_states(tmp_path, pos):
    from transformers import AutoModel, RobertaForMaskedLM

    model = trained_looking(pos)
    assert save_pretrained(model, tmp_path) == "hf"
    ids, mask = batch()
    ours = model(ids, mask, output_hidden_states=True)
    hf = RobertaForMaskedLM.from_pretrained(tmp_path).eval()
    theirs = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    assert (ours.logits - theirs.logits)[real].abs().max() <= 1e-5
    assert len(ours.hidden_states) == len(theirs.hidden_states) == 3
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        assert (a - b)[real].abs().max() <= 1e-5
    base = AutoModel.from_pretrained(tmp_path).eval()
    for a, b in zip(ours.hidden_states, base(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states):
        assert (a - b)[real].abs().max() <= 1e-5
    back = load_pretrained(tmp_path).eval()
    assert back.config.pos_name == pos
    assert (back(ids, mask).logits - ours.logits).abs().max() <= 1e-6


def test_none_exports_an_all_zero_position_table(tmp_path):
    from safetensors.torch import load_file

    save_pretrained(trained_looking("none"), tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    table = sd["roberta.embeddings.position_embeddings.weight"]
    assert table.shape == (16 + 2, 32) and table.abs().max() == 0
    assert sd["roberta.embeddings.token_type_embeddings.weight"].abs().max() == 0
    assert json.loads((tmp_path / "config.json").read_text())["max_position_embeddings"] == 18


def test_hf_roberta_with_token_type_row_imports_exactly(tmp_path):
    """roberta-base has a non-zero token-type row; importing folds it into the position table."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(0)
    hf = RobertaForMaskedLM(RobertaConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, max_position_embeddings=18, type_vocab_size=1)).eval()
    with torch.no_grad():
        hf.roberta.embeddings.token_type_embeddings.weight.normal_(0, 0.5)
    hf.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path).eval()
    ids, mask = batch()
    assert ours.config.pos_name == "learned" and ours.config.max_len == 16
    diff = (ours(ids, mask).logits - hf(input_ids=ids, attention_mask=mask).logits)[mask.bool()]
    assert diff.abs().max() <= 1e-5


@pytest.mark.parametrize("pos", ["relative", "sinusoidal", "rope", "alibi"])
def test_other_schemes_round_trip_in_our_format(tmp_path, pos):
    model = trained_looking(pos)
    assert save_pretrained(model, tmp_path) == "outlierlab"
    assert (tmp_path / "outlierlab_config.json").exists() and not (tmp_path / "config.json").exists()
    back = load_pretrained(tmp_path).eval()
    ids, mask = batch()
    assert back.config == model.config
    assert torch.equal(back(ids, mask).logits, model(ids, mask).logits)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="neither outlierlab_config.json nor"):
        load_pretrained(tmp_path)


def test_hf_export_prints_no_shard_bar_and_leaves_transformers_bars_as_they_were(tmp_path, capfd):
    """transformers' "Writing model shards" bar (one small shard) landed in every train.py log; the export hides
    it for its own save only: a bar disabled by the user stays disabled, an enabled one is enabled again."""
    from transformers.utils import logging as hf_logging

    model = trained_looking("learned")
    try:
        hf_logging.enable_progress_bar()
        assert save_pretrained(model, tmp_path / "a") == "hf"
        assert "Writing model shards" not in capfd.readouterr().err
        assert hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        save_pretrained(model, tmp_path / "b")
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()
