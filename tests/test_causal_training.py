"""objective=clm end to end: train.py, resume, export, the step-0 checkpoint, checkpoint probes, evaluate.py."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from tests.conftest import compose
from tests.run_fixtures import SMALL, small_cfg, train_losses

# each test trains the causal model end to end (and resumes or evaluates it): the full suite's, not the fast tier's
pytestmark = pytest.mark.slow


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_clm_trains_resumes_exactly_and_exports_a_causal_lm(tmp_path, shared_cache):
    from outlierlab.jobs.training import train

    common = ["objective=clm", "pos=none", "trainer.limit_val_batches=2", "trainer.val_check_interval=6",
              "module.scheduler.num_training_steps=12", "module.scheduler.num_warmup_steps=2",
              "callbacks.model_checkpoint.every_n_train_steps=6", "lr=1e-2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    metrics = train(small_cfg(straight, "trainer.max_steps=12", *common))
    train(small_cfg(resumed, "trainer.max_steps=6", *common))
    train(small_cfg(resumed, "trainer.max_steps=12", "ckpt_path=last", *common))
    a, b = train_losses(straight), train_losses(resumed)
    assert a[11] < a[0] - 0.5, a  # from ~ln(1000) = 6.9
    for step in range(6, 12):
        assert b[step] == pytest.approx(a[step], abs=1e-5), step
    assert metrics["val/ppl"] == pytest.approx(float(torch.exp(torch.tensor(metrics["val/loss"]))), rel=1e-4)
    hf_config = json.loads((straight / "hf" / "config.json").read_text())
    assert hf_config["is_decoder"] and hf_config["architectures"] == ["RobertaForCausalLM"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(straight / "hf")
    model = AutoModelForCausalLM.from_pretrained(straight / "hf").eval()
    enc = tok("It is a truth universally acknowledged", return_tensors="pt")
    labels = enc["input_ids"].clone()
    # the same shifted loss as ours, computed by transformers' RobertaForCausalLM on the exported weights
    from outlierlab.models import load_pretrained

    ours = load_pretrained(straight / "hf").eval()
    with torch.no_grad():
        assert model(**enc, labels=labels).loss.item() == pytest.approx(
            ours(enc["input_ids"], labels=labels).loss.item(), rel=1e-5)


def test_clm_run_step0_checkpoint_probes_and_evaluate(tmp_path, shared_cache):
    """The step-0 checkpoint is the initialisation; checkpoint_probes gathers the probe of each step; evaluate.py
    reads the run as a decoder (next-token head, no attention to later tokens)."""
    from omegaconf import open_dict

    from outlierlab.jobs.checkpoint_probes import probe_run
    from outlierlab.jobs.training import train

    tmp_path = tmp_path / "objective=clm,pos=none,seed=1"  # a sweep cell's name: '=' and ',' in every path
    cfg = compose("train", [f"run_dir='{tmp_path}'", *SMALL, "objective=clm", "trainer.max_steps=4",
                            "trainer.limit_val_batches=1", "callbacks.model_checkpoint.every_n_train_steps=4"])
    with open_dict(cfg):
        cfg.callbacks.initial_checkpoint = {
            "_target_": "outlierlab.lightning_modules.callbacks.initial_checkpoint.InitialCheckpoint",
            "dirpath": f"{tmp_path}/checkpoints"}
    train(cfg)
    step0 = torch.load(tmp_path / "checkpoints" / "step0000000.ckpt", map_location="cpu", weights_only=False)
    assert step0["global_step"] == 0 and step0["hyper_parameters"]["model"]["causal"] is True
    done = probe_run(tmp_path, ["data.max_sentences=60", "probe.epochs=1", "probe.max_distance=4"], max_sentences=60)
    assert done == [0, 4]
    rows = _rows(tmp_path / "probe_posthoc" / "position_probe.csv")
    assert sorted({int(r["step"]) for r in rows}) == [0, 4] and len(rows) == 2 * 3  # 2 steps x (embeddings + 2 layers)
    assert all(0 <= float(r["accuracy"]) <= 1 and float(r["mean_abs_error"]) >= 0 for r in rows)
    sims = _rows(tmp_path / "probe_posthoc" / "similarity_by_distance.csv")
    assert {int(r["distance"]) for r in sims} == {1, 2, 3, 4}
    use = _rows(tmp_path / "probe_posthoc" / "order_use.csv")
    assert sorted(int(r["step"]) for r in use) == [0, 4] and all(r["order_use"] for r in use)  # uses the order?
    per_layer = _rows(tmp_path / "probe_posthoc" / "order_use_layers.csv")
    assert sorted({(int(r["step"]), int(r["layer"])) for r in per_layer}) == [(s, l) for s in (0, 4) for l in range(3)]
    assert probe_run(tmp_path, ["data.max_sentences=60", "probe.epochs=1"], max_sentences=60) == []  # resumable

    from outlierlab.models.lm_model import load_mlm

    loaded = load_mlm(str(tmp_path))
    assert loaded.objective == "next_token" and loaded.family.decoder
