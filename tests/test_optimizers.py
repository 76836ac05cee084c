"""The optimizer switch (configs/optimizer, outlierlab.models.optimizers): every arm trains, resumes exactly, and
Muon gets exactly the blocks' matrices."""

from __future__ import annotations

import functools
import io
import json

import hydra
import pytest
import torch

from outlierlab.lightning_modules.mlm_module import MLMLitModule, weight_decay_groups
from outlierlab.models import EncoderConfig
from outlierlab.models.optimizers import MuonWithAdamW, build_optimizer, hidden_matrices
from tests.conftest import compose
from tests.run_fixtures import small_cfg, train_losses

ARMS = ["adamw", "sgd", "muon", "soap", "adafactor", "lion"]
CLASSES = {"adamw": "AdamW", "sgd": "SGD", "muon": "MuonWithAdamW", "soap": "SOAP", "adafactor": "Adafactor",
           "lion": "Lion"}


def tiny_module(arm: str, seed: int = 0) -> MLMLitModule:
    torch.manual_seed(seed)
    cfg = compose("train", [f"optimizer={arm}", "run_dir=unused"])
    config = EncoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                           max_len=16, dropout=0.0, attention_dropout=0.0, pos={"name": "learned"})
    return MLMLitModule(config, hydra.utils.instantiate(cfg.optimizer), None)


def batch(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (8, 16), generator=g)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(ids.shape, generator=g) < 0.3
    labels[masked] = ids[masked]
    return {"input_ids": ids.masked_fill(masked, 4), "attention_mask": torch.ones_like(ids), "labels": labels}


def step(module: MLMLitModule, optimizer: torch.optim.Optimizer, b: dict[str, torch.Tensor]) -> float:
    def closure():
        optimizer.zero_grad()
        loss = module.model(**b).loss
        loss.backward()
        return loss

    return float(optimizer.step(closure))


@pytest.mark.parametrize("arm", ARMS)
def test_each_optimizer_lowers_the_loss_and_resumes_exactly(arm):
    """Five steps on one batch lower its loss; an optimizer rebuilt from a saved state dict (serialized, as a
    checkpoint is) takes the next step exactly as the uninterrupted one does."""
    b = batch()
    module = tiny_module(arm)
    optimizer = module.configure_optimizers()
    assert type(optimizer).__name__ == CLASSES[arm]
    losses = [step(module, optimizer, b) for _ in range(5)]
    assert losses[-1] < losses[0], losses
    buf = io.BytesIO()
    torch.save({"model": module.model.state_dict(), "optimizer": optimizer.state_dict()}, buf)
    step(module, optimizer, b)
    straight = {k: v.clone() for k, v in module.model.state_dict().items()}

    resumed = tiny_module(arm, seed=123)  # other initial weights: everything must come from the saved state
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    resumed.model.load_state_dict(saved["model"])
    opt2 = resumed.configure_optimizers()
    opt2.load_state_dict(saved["optimizer"])
    step(resumed, opt2, b)
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, straight[k]), (arm, k)


def test_muon_gets_the_blocks_matrices_and_adamw_the_rest():
    module = tiny_module("muon")
    optimizer = module.configure_optimizers()
    muon, adamw = optimizer.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    names = {id(p): n for n, p in module.model.named_parameters()}
    got = sorted(names[i] for i in in_muon)
    # 2 blocks x (query, key, value, attention output, FFN in, FFN out)
    assert len(got) == 12 and all(".encoder.layer." in n and n.endswith(".weight") for n in got), got
    assert all(module.model.get_parameter(n).ndim == 2 for n in got)
    rest = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert "roberta.embeddings.word_embeddings.weight" in rest and "lm_head.dense.weight" in rest
    assert not any(module.model.get_parameter(n).ndim == 2 and ".encoder.layer." in n and "dense" in n
                   and n.endswith("weight") and "LayerNorm" not in n for n in rest)
    assert len(in_muon) + len(rest) == sum(1 for _ in module.model.parameters())  # every parameter, once
    # the scheduler's view: one list of groups that are the inner optimizers' own
    assert optimizer.param_groups == muon.param_groups + adamw.param_groups
    assert all(a is b for a, b in zip(optimizer.param_groups, muon.param_groups + adamw.param_groups))


def test_muon_update_of_a_matrix_is_orthogonal_and_1d_parameters_never_reach_it():
    """Muon's step on a matrix is its momentum orthogonalised by Newton-Schulz: singular values near 1 (Jordan et
    al.'s quintic iteration lands them in about [0.7, 1.2]); with the original rate rule (no RMS matching) and
    no weight decay the change of the weight is ``lr`` times that matrix."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(16, 32))
    bias = torch.nn.Parameter(torch.randn(16))
    before_w, before_b = w.detach().clone(), bias.detach().clone()
    g = torch.randn(16, 32) * torch.logspace(-2, 1, 32)  # a gradient with very unequal directions
    w.grad, bias.grad = g.clone(), torch.randn(16)
    lr = 0.5
    opt = MuonWithAdamW([{"params": [w, bias]}], matrices=[w], lr=lr, weight_decay=0.0, nesterov=False,
                        adjust_lr_fn="original")
    opt.step()
    update = (before_w - w.detach()) / lr
    s = torch.linalg.svdvals(update)
    assert s.min() > 0.6 and s.max() < 1.25, s
    assert torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 50  # the raw gradient was far from it
    # the bias went to AdamW: its first step is lr * sign(grad) (bias-corrected Adam, eps negligible)
    assert torch.allclose(before_b - bias.detach(), lr * torch.sign(bias.grad), atol=1e-4)
    with pytest.raises(ValueError, match="2-D matrices only"):
        MuonWithAdamW([{"params": [bias]}], matrices=[bias], lr=lr)


def test_hidden_matrices_of_a_model_without_blocks_is_refused_in_one_line():
    plain = torch.nn.Linear(3, 3)  # no transformer blocks: nothing for Muon
    assert hidden_matrices(plain) == []
    with pytest.raises(ValueError, match="no 2-D weight matrix inside the transformer blocks"):
        build_optimizer(functools.partial(MuonWithAdamW, lr=1e-3), plain, [{"params": list(plain.parameters())}])


def test_recipe_rates_flow_into_each_arm():
    """`lr` is the recipe's rate: AdamW, Muon and SOAP take it, Lion a tenth; SGD and Adafactor keep their own;
    `optimizer.lr` sets the chosen optimizer's rate itself; the ladder's rate reaches AdamW and Muon."""
    rates = {arm: compose("train", [f"optimizer={arm}", "lr=2e-3", "run_dir=x"]).optimizer.lr for arm in ARMS}
    assert rates == {"adamw": 2e-3, "sgd": 0.1, "muon": 2e-3, "soap": 2e-3, "adafactor": 1e-2,
                     "lion": pytest.approx(2e-4)}
    assert compose("train", ["optimizer=sgd", "optimizer.lr=0.05", "run_dir=x"]).optimizer.lr == 0.05
    ladder = compose("train", ["experiment=scale_ladder", "ladder=4x256", "optimizer=muon", "run_dir=x"])
    assert ladder.optimizer.lr == 8.5e-4 and ladder.optimizer.eps == 1e-12  # the ladder's rate, the recipe's eps
    assert compose("train", ["experiment=scale_ladder", "optimizer=sgd", "run_dir=x"]).optimizer.get("eps") is None


@pytest.mark.slow
def test_a_muon_run_resumes_exactly_and_its_cell_card_and_marker_name_it(tmp_path, shared_cache):
    """Through train.py: 3 steps + resume to 6 == 6 straight steps (Muon's and AdamW's states both in last.ckpt);
    finished.json and the model card carry the optimizer."""
    from outlierlab.jobs.training import train

    common = ["optimizer=muon", "trainer.limit_val_batches=0", "module.scheduler.num_training_steps=6",
              "module.scheduler.num_warmup_steps=2", "callbacks.model_checkpoint.every_n_train_steps=3"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(small_cfg(straight, "trainer.max_steps=6", *common))
    train(small_cfg(resumed, "trainer.max_steps=3", *common))
    train(small_cfg(resumed, "trainer.max_steps=6", "ckpt_path=last", *common))
    a, b = train_losses(straight), train_losses(resumed)
    assert a[5] == pytest.approx(b[5], abs=1e-6) and a[4] == pytest.approx(b[4], abs=1e-6)
    assert json.loads((straight / "finished.json").read_text())["optimizer"] == "MuonWithAdamW"
    card = (straight / "hf" / "README.md").read_text()
    assert "**Optimizer:** MuonWithAdamW" in card and "adjust lr fn match_rms_adamw" in card
