"""Architecture switches against outliers: every (position scheme x switch) trains and reloads from its
export, in-process and from the command line. Each switch against its equation: tests/test_encoder_switches.py."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from outlierlab.models import POSITION_SCHEMES, RobertaMaskedLM, load_pretrained, save_pretrained
from tests.encoder_fixtures import batch, cfg


# ------------------------------------------------------------------------------ every scheme x switch
SWITCHES = {
    "pre": dict(norm_placement="pre"),
    "noaffine": dict(norm="layernorm_noaffine"),
    "rmsnorm": dict(norm="rmsnorm"),
    "clipped": dict(attention="clipped_softmax", clip_gamma=-0.1),
    "gated": dict(attention="gated"),
    "gated_mlp": dict(attention="gated", gate="mlp", gate_hidden=4),
    "op": dict(block="op"),
}


@pytest.mark.parametrize("switch", sorted(SWITCHES))
@pytest.mark.parametrize("pos", sorted(POSITION_SCHEMES))
def test_every_scheme_and_switch_trains_and_reloads_from_its_export(tmp_path, caplog, pos, switch):
    torch.manual_seed(0)
    model = RobertaMaskedLM(cfg(pos={"name": pos}, **SWITCHES[switch]))
    ids, mask = batch()
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) < 0.3, ids, -100)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = model(ids, mask, labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]  # it learns the fixed batch
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    with caplog.at_level(logging.WARNING, logger="outlierlab.models.export"):
        fmt = save_pretrained(model.eval(), tmp_path, format="hf")
    assert fmt == "outlierlab" and "cannot represent" in caplog.text and len(caplog.records) == 1
    back = load_pretrained(tmp_path).eval()
    assert back.config == model.config
    assert torch.equal(back(ids, mask).logits, model(ids, mask).logits)


def test_plain_roberta_with_learned_positions_still_exports_to_hf(tmp_path):
    assert save_pretrained(RobertaMaskedLM(cfg()).eval(), tmp_path, format="hf") == "hf"
    assert (tmp_path / "config.json").exists()
    with pytest.raises(ValueError, match="unknown export format 'onnx'"):
        save_pretrained(RobertaMaskedLM(cfg()), tmp_path, format="onnx")


# ------------------------------------------------------------------------------ the command line
@pytest.mark.slow
def test_cli_sweep_over_schemes_and_attention_kinds(tmp_path, shared_cache):
    """`python train.py -m pos=learned,none model.attention=softmax,clipped_softmax,gated`: every job trains,
    plain RoBERTa exports to hf/, the others to model/, and each export reloads as the job's config."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.run_fixtures import SMALL

    sweep = tmp_path / "sweep"
    env = {**{k: v for k, v in os.environ.items() if k != "OUTLIERLAB_DEBUG"}, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "train.py", "-m", "pos=learned,none",
                        "model.attention=softmax,clipped_softmax,gated", "trainer.max_steps=2",
                        "trainer.limit_val_batches=0", "callbacks=none", "logger=none", f"hydra.sweep.dir={sweep}",
                        *SMALL], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())  # cells named by their overrides
    assert len(jobs) == 6
    seen = set()
    for job in jobs:
        export = job / "hf" if (job / "hf").exists() else job / "model"
        model = load_pretrained(export)
        seen.add((model.config.pos_name, model.config.attention))
        assert (export.name == "hf") == (model.config.attention == "softmax")
        if export.name == "model":
            assert json.loads((export / "outlierlab_config.json").read_text())["attention"] == model.config.attention
    assert seen == {(p, a) for p in ("learned", "none") for a in ("softmax", "clipped_softmax", "gated")}
