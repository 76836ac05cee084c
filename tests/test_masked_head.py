"""The training speed-ups change no number: the MLM head on masked positions only, attention
without a mask when nothing is padded, and the non-finite guard that reads the device only now and then."""

from __future__ import annotations

import pytest
import torch

from outlierlab.lightning_modules.callbacks.progress_lines import default_tokens
from outlierlab.lightning_modules.mlm_module import MLMLitModule, NonFiniteLossError, prepare_mlm_batch
from outlierlab.models import EncoderConfig, RobertaMaskedLM

SCHEMES = ["none", "learned", "sinusoidal", "relative", "rope", "alibi"]


def tiny(pos: str = "learned", dtype=torch.float64, **kw) -> RobertaMaskedLM:
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                        max_len=24, dropout=0.0, attention_dropout=0.0, pos={"name": pos}, **kw)
    return RobertaMaskedLM(cfg).to(dtype)


def batch(seed: int = 1, B: int = 3, T: int = 16, p: float = 0.15):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (B, T), generator=g)
    ids[:, 0] = 0
    labels = torch.where(torch.rand(B, T, generator=g) < p, torch.randint(5, 50, (B, T), generator=g), -100)
    labels[0, 3] = 7  # at least one masked token
    return ids, labels


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_masked_head_equals_full_head_loss_and_gradients():
    ids, labels = batch()
    full, masked = tiny(), tiny()
    out_full = full(ids, labels=labels, full_logits=True)
    out_masked = masked(ids, labels=labels)
    out_full.loss.backward()
    out_masked.loss.backward()
    assert out_full.logits.shape == (3, 16, 50)
    n = int((labels != -100).sum())
    assert out_masked.logits.shape == (n, 50)
    torch.testing.assert_close(out_masked.loss, out_full.loss, rtol=0, atol=1e-12)
    # the masked rows are exactly the full head's rows at those positions
    torch.testing.assert_close(out_masked.logits, out_full.logits.reshape(-1, 50)[labels.reshape(-1) != -100])
    g_full, g_masked = grads(full), grads(masked)
    assert g_full.keys() == g_masked.keys()
    for name in g_full:
        torch.testing.assert_close(g_masked[name], g_full[name], rtol=1e-9, atol=1e-12, msg=name)


def test_precomputed_positions_give_the_same_loss():
    ids, labels = batch(2)
    model = tiny()
    pos = (labels.reshape(-1) != -100).nonzero().squeeze(1)
    a = model(ids, labels=labels).loss
    b = model(ids, labels=labels, masked_positions=pos).loss
    assert a.item() == b.item()


def test_batch_without_masked_token_gives_zero_loss_not_nan():
    ids, _ = batch()
    model = tiny()
    out = model(ids, labels=torch.full_like(ids, -100))
    assert out.logits.shape == (0, 50)
    assert torch.isfinite(out.loss) and out.loss.item() == 0.0
    out.loss.backward()  # the graph is intact; every gradient is zero
    assert all(float(p.grad.abs().max()) == 0.0 for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("pos", SCHEMES)
def test_no_mask_equals_all_ones_mask(pos):
    ids, _ = batch(3)
    model = tiny(pos).eval()
    with torch.no_grad():
        for p in model.parameters():  # make position parameters matter beyond the 0.02 init scale
            p.add_(0.1 * torch.randn_like(p))
        a = model.roberta(ids, torch.ones_like(ids), output_hidden_states=True)
        b = model.roberta(ids, None, output_hidden_states=True)
    for x, y in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pos", SCHEMES)
def test_padding_is_still_masked(pos):
    """A padded row's real tokens equal the same tokens run alone: the mask still hides the padding."""
    ids, _ = batch(4, B=2, T=12)
    model = tiny(pos).eval()
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    padded = ids.clone()
    padded[1, 8:] = model.config.pad_token_id
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        both = model.roberta(padded, mask).last_hidden_state
        alone = model.roberta(ids[1:, :8], None).last_hidden_state
    torch.testing.assert_close(both[1, :8], alone[0], rtol=1e-10, atol=1e-10)


def test_prepare_batch_drops_only_an_all_ones_mask_and_indexes_the_labels():
    ids, labels = batch()
    full = prepare_mlm_batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    assert "attention_mask" not in full
    assert full["masked_positions"].tolist() == (labels.reshape(-1) != -100).nonzero().flatten().tolist()
    assert default_tokens(full) == ids.numel()
    mask = torch.ones_like(ids)
    mask[-1, -4:] = 0
    padded = prepare_mlm_batch({"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert padded["attention_mask"] is mask and default_tokens(padded) == ids.numel() - 4


def _module() -> MLMLitModule:
    cfg = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_len=24)
    return MLMLitModule(cfg, optimizer=lambda p: torch.optim.AdamW(p), finite_check_every_n_steps=5)


class _Trainer:  # the two attributes the guard reads
    max_steps = 100


def test_deferred_guard_names_the_first_bad_step(monkeypatch):
    """On an accelerator the guard records the first non-finite step on the device and raises at the
    next check (every finite_check_every_n_steps, and before any checkpoint); simulated here on CPU."""
    module = _module()
    module._defer_finite_check = True
    step = {"value": 0}
    monkeypatch.setattr(MLMLitModule, "global_step", property(lambda self: step["value"]))
    monkeypatch.setattr(MLMLitModule, "trainer", property(lambda self: _Trainer()))
    for s, loss in enumerate([1.0, 2.0, float("nan"), 3.0, float("inf")]):
        step["value"] = s
        module._guard_finite(torch.tensor(loss))  # no raise: nothing is read back
    with pytest.raises(NonFiniteLossError, match=r"training loss became NaN or inf at global step 2;"):
        module.on_save_checkpoint({})
    step["value"] = 5
    with pytest.raises(NonFiniteLossError, match="at global step 2;"):
        module.on_train_batch_end(None, None, 0)


def test_guard_is_immediate_on_cpu():
    module = _module()
    with pytest.raises(NonFiniteLossError, match="became nan at global step 0"):
        module._guard_finite(torch.tensor(float("nan")))
    assert module._defer_finite_check is False


def test_finite_check_interval_must_be_positive():
    cfg = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_len=24)
    with pytest.raises(ValueError, match="finite_check_every_n_steps must be >= 1"):
        MLMLitModule(cfg, optimizer=lambda p: torch.optim.AdamW(p), finite_check_every_n_steps=0)
