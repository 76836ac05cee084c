"""Every fast path of train.py gives the plain path's numbers (docs/gpu.md states the tolerances):

* attention through ``F.scaled_dot_product_attention`` (the flash / memory-efficient kernels on a GPU) equals the
  explicit softmax path for every position scheme, with and without padding -- and a mask that leaks padding fails;
* activation checkpointing: the same loss and gradients, dropout included (the RNG state is restored for the
  recomputation) -- without restoring it the gradients differ, which the test shows it can see;
* fused AdamW equals the unfused update, and trains under bf16-mixed with gradient clipping, which Lightning's
  plugin refuses for a fused optimizer (the module clips itself);
* ``module.compile=auto`` compiles on CUDA only.
"""

from __future__ import annotations

import pytest
import torch

from outlierlab.models import EncoderConfig
from outlierlab.models.encoder import RobertaMaskedLM
from outlierlab.models.positions import POSITION_SCHEMES as SCHEMES
from tests.run_fixtures import final_weights, small_cfg

TINY = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_len=24)
#: float32 on CPU; the kernels differ only in summation order
ATOL = 1e-5


def tiny(pos: str, **kw) -> RobertaMaskedLM:
    torch.manual_seed(0)
    return RobertaMaskedLM(EncoderConfig(**{**TINY, "pos": {"name": pos}, **kw})).eval()


def batch(padded: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 97, (3, 20), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 14:] = 0
        mask[2, 9:] = 0
        ids = ids.masked_fill(mask == 0, 1)
    return ids, mask


@pytest.mark.parametrize("pos", sorted(SCHEMES))
@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_equals_the_explicit_softmax_path(pos, padded):
    model = tiny(pos)
    ids, mask = batch(padded)
    with torch.no_grad():
        fused = model.roberta(ids, mask if padded else None).last_hidden_state
        explicit = model.roberta(ids, mask if padded else None, output_attentions=True).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(fused[real], explicit[real], atol=ATOL, rtol=0)


def test_a_mask_that_leaks_padding_is_caught():
    """The same comparison with the padding mask dropped on the fused side: the real tokens change."""
    model = tiny("learned")
    ids, mask = batch(True)
    with torch.no_grad():
        leaky = model.roberta(ids, None).last_hidden_state
        right = model.roberta(ids, mask, output_attentions=True).last_hidden_state
    assert (leaky[mask.bool()] - right[mask.bool()]).abs().max() > 1e-3


def _loss_and_grads(model, ids, labels):
    model.zero_grad()
    torch.manual_seed(123)  # dropout masks
    out = model(ids, None, labels)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(pos, monkeypatch):
    model = tiny(pos, dropout=0.1, attention_dropout=0.1).train()
    ids, _ = batch(False)
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]
    plain_loss, plain = _loss_and_grads(model, ids, labels)
    model.roberta.activation_checkpointing = True
    loss, grads = _loss_and_grads(model, ids, labels)
    torch.testing.assert_close(loss, plain_loss, atol=ATOL, rtol=0)
    assert grads.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(grads[name], plain[name], atol=ATOL, rtol=1e-4, msg=name)
    # the test can see a broken recomputation: without the RNG state restored, dropout draws other masks
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint",
                        lambda *a, **k: real(*a, **{**k, "preserve_rng_state": False}))
    _, broken = _loss_and_grads(model, ids, labels)
    assert max((broken[n] - plain[n]).abs().max().item() for n in plain) > 1e-4


def test_fused_adamw_equals_the_unfused_update():
    updates = {}
    for fused in (False, True):
        model = tiny("learned").train()
        ids, _ = batch(False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01,
                                fused=fused, foreach=False if not fused else None)
        for _ in range(3):
            opt.zero_grad()
            model(ids, None, ids).loss.backward()
            opt.step()
        updates[fused] = {n: p.detach().clone() for n, p in model.named_parameters()}
    for name, value in updates[False].items():
        torch.testing.assert_close(updates[True][name], value, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.slow
def test_fused_adamw_trains_under_bf16_with_clipping(tmp_path, shared_cache):
    """Lightning's bf16 plugin raises for clipping with a fused optimizer; the module clips and the weights equal the
    unfused run's. Clipping really acts: without it the weights differ."""
    from outlierlab.jobs.training import train

    common = ["trainer.max_steps=3", "trainer.limit_val_batches=0", "export=false", "trainer.precision=bf16-mixed",
              "model.dropout=0.0", "model.attention_dropout=0.0", "lr=5e-3"]
    runs = {}
    for name, extra in {"plain": ["module.fused_optimizer=false", "trainer.gradient_clip_val=0.05"],
                        "fused": ["module.fused_optimizer=true", "trainer.gradient_clip_val=0.05"],
                        "unclipped": ["module.fused_optimizer=true", "trainer.gradient_clip_val=null"]}.items():
        train(small_cfg(tmp_path / name, *common, *extra))
        runs[name] = final_weights(tmp_path / name)
    for key, value in runs["plain"].items():
        torch.testing.assert_close(runs["fused"][key], value, atol=1e-5, rtol=1e-4, msg=key)
    assert max((runs["unclipped"][k] - runs["fused"][k]).abs().max().item() for k in runs["fused"]) > 1e-4


def test_compile_auto_compiles_on_cuda_only():
    from outlierlab.lightning_modules.mlm_module import MLMLitModule

    module = MLMLitModule(EncoderConfig(**TINY), optimizer=torch.optim.AdamW, compile="auto")
    assert module._training_forward() is module.model and module.compile_options is None  # on this CPU: eager
    with pytest.raises(ValueError, match="module.compile must be true, false, auto or a dict"):
        MLMLitModule(EncoderConfig(**TINY), optimizer=torch.optim.AdamW, compile="sometimes")
    with pytest.raises(ValueError, match="module.fused_optimizer must be true, false or auto"):
        MLMLitModule(EncoderConfig(**TINY), optimizer=torch.optim.AdamW, fused_optimizer="yes")
