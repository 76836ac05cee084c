"""The vocabulary projection at the scored rows only (``outlierlab.metrics.scored_rows.logits_at``, through
``LoadedModel.forward(..., rows=)``): the ablation's, order use's and frequent_tokens' scoring, in every family."""

from __future__ import annotations

import pytest
import torch

from family_models import DECODERS, SPECS, build


@pytest.mark.parametrize("model_type", list(SPECS))
def test_logits_at_the_scored_rows_equal_the_full_head_in_every_family(model_type):
    """``LoadedModel.forward(..., rows=)`` (the ablation's and order use's scoring): the logits at the scored
    positions equal the full head's rows, and where the head's last Linear is the output embedding the vocabulary
    projection saw those rows alone (``analysis.scored_rows.logits_at``); the hook is gone afterwards."""
    from outlierlab.models.lm_model import LoadedModel

    model, tok = build(model_type)
    loaded = LoadedModel(model, tok, {}, "hf", model_type, True,
                         objective="next_token" if model_type in DECODERS else "masked_lm")
    enc = tok(["the quick brown fox jumps over the lazy dog", "a short one"], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    rows = torch.zeros_like(ids, dtype=torch.bool)
    rows[0, [1, 4, 5]] = rows[1, 2] = True
    full = loaded.forward(ids, mask).logits
    head = model.get_output_embeddings()
    seen = []
    spy = head.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[:-1].numel()))
    try:
        narrow = loaded.forward(ids, mask, rows=rows).logits
    finally:
        spy.remove()
    assert narrow.shape == (4, full.shape[-1])
    torch.testing.assert_close(narrow, full[rows], rtol=1e-5, atol=1e-5)
    if isinstance(head, torch.nn.Linear):
        assert seen == [4]
    assert not head._forward_pre_hooks


@pytest.mark.parametrize("causal", [False, True])
def test_our_own_model_scores_the_rows_alone_and_equals_its_full_head(causal):
    """Our ``RobertaMaskedLM`` (a train.py run, ``kind="outlierlab"``): ``masked_positions`` without labels runs its
    head at those rows only, for either objective, with the full head's logits there."""
    from outlierlab.models.lm_model import LoadedModel
    from outlierlab.models import EncoderConfig, RobertaMaskedLM

    torch.manual_seed(0)
    model = RobertaMaskedLM(EncoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4,
                                          intermediate_size=64, max_len=16, causal=causal)).eval()
    loaded = LoadedModel(model, None, {}, "outlierlab", "ours", True,
                         objective="next_token" if causal else "masked_lm")
    ids = torch.randint(5, 50, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    rows = torch.zeros_like(ids, dtype=torch.bool)
    rows[0, [1, 4, 5]] = rows[1, 2] = True
    full = loaded.forward(ids, mask).logits
    seen = []
    spy = model.lm_head.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[:-1].numel()))
    try:
        narrow = loaded.forward(ids, mask, rows=rows).logits
    finally:
        spy.remove()
    assert seen == [4] and narrow.shape == (4, 50)
    torch.testing.assert_close(narrow, full[rows], rtol=1e-5, atol=1e-5)
