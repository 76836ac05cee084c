"""Weight-decay scope: which parameters decay (fairseq: all; BERT/HF: not norms, not biases)."""
from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from outlierlab.lightning_modules.mlm_module import MLMLitModule, weight_decay_groups
from outlierlab.models import EncoderConfig, RobertaMaskedLM


class PlantedRMSNorm(nn.Module):
    """A norm we do not import from torch: recognised by its class name."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


def planted() -> nn.Module:
    m = nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3), nn.Linear(3, 3, bias=False), PlantedRMSNorm(3))
    m.append(nn.Linear(3, 1)).requires_grad_(True)
    m[4].weight.requires_grad_(False)  # frozen parameters are in no group
    return m


def ids(params) -> set[int]:
    return {id(p) for p in params}


def test_no_norm_bias_scope_exempts_exactly_norms_and_biases():
    m = planted()
    decay, exempt = weight_decay_groups(m, "no_norm_bias")
    assert ids(decay["params"]) == ids([m[0].weight, m[2].weight])
    assert ids(exempt["params"]) == ids([m[0].bias, m[1].weight, m[1].bias, m[3].weight, m[4].bias])
    assert exempt["weight_decay"] == 0.0 and "weight_decay" not in decay


def test_all_scope_is_one_group_of_every_trainable_parameter():
    m = planted()
    (group,) = weight_decay_groups(m, "all")
    assert ids(group["params"]) == ids(p for p in m.parameters() if p.requires_grad)
    assert len(group["params"]) == 7


def test_decay_shrinks_only_the_decayed_parameters_by_hand_computed_factor():
    """AdamW with zero gradients moves a parameter only by decay: p <- p * (1 - lr * wd) = p * 0.95."""
    for scope in ("all", "no_norm_bias"):
        torch.manual_seed(0)
        m = planted()
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        opt = torch.optim.AdamW(weight_decay_groups(m, scope), lr=0.1, weight_decay=0.5)
        for p in m.parameters():
            p.grad = torch.zeros_like(p) if p.requires_grad else None
        opt.step()
        for n, p in m.named_parameters():
            frozen = not p.requires_grad
            exempt = scope == "no_norm_bias" and (n.endswith("bias") or n.startswith(("1.", "3.")))
            factor = 1.0 if frozen or exempt else 0.95
            assert torch.allclose(p, before[n] * factor), (scope, n)


def test_encoder_layernorms_follow_the_scope():
    model = RobertaMaskedLM(EncoderConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                                          intermediate_size=32, max_len=16))
    norms = ids(p for n, p in model.named_parameters() if "LayerNorm" in n or "layer_norm" in n)
    biases = ids(p for n, p in model.named_parameters() if n.endswith(".bias"))
    assert norms  # the encoder has LayerNorms (embeddings, every layer, MLM head)
    decay, exempt = weight_decay_groups(model, "no_norm_bias")
    assert ids(exempt["params"]) == norms | biases
    assert not ids(decay["params"]) & (norms | biases)
    # every parameter exactly once
    assert len(decay["params"]) + len(exempt["params"]) == len({id(p) for p in model.parameters()})
    (group,) = weight_decay_groups(model, "all")
    assert norms <= ids(group["params"])


def test_module_uses_its_scope_and_refuses_unknown_ones():
    cfg = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_len=16)
    opt = MLMLitModule(cfg, partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.01),
                       weight_decay_scope="all").configure_optimizers()
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 0.01
    opt = MLMLitModule(cfg, partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.01)).configure_optimizers()
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    with pytest.raises(ValueError, match="weight_decay_scope 'norms'.*all, no_norm_bias"):
        MLMLitModule(cfg, partial(torch.optim.AdamW), weight_decay_scope="norms")


def test_paper_recipe_decays_every_parameter_as_fairseq_did(compose_cfg):
    cfg = compose_cfg("train", ["experiment=paper_roberta_base", "run_dir=/tmp/unused"])
    assert cfg.module.weight_decay_scope == "all"
    assert compose_cfg("train", ["run_dir=/tmp/unused"]).module.weight_decay_scope == "no_norm_bias"
