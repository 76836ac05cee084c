"""Every config in configs/ composes and instantiates (a Hydra-composed fixture, as
lightning-hydra-template does)."""

from __future__ import annotations

import hydra
import pytest
from omegaconf import OmegaConf

from outlierlab.configuration.overrides import group_options
from outlierlab.models import EncoderConfig, RobertaMaskedLM
from tests.conftest import compose


@pytest.mark.parametrize("pos", group_options("pos"))
@pytest.mark.parametrize("model", group_options("model"))
def test_every_pos_and_model_builds(tmp_path, pos, model):
    cfg = compose("train", [f"run_dir={tmp_path}", f"pos={pos}", f"model={model}"])
    config = hydra.utils.instantiate(cfg.model, vocab_size=300)
    assert isinstance(config, EncoderConfig) and config.pos_name == pos
    if model == "base":  # the paper's Table 4 architecture, exactly
        assert (config.num_layers, config.hidden_size, config.intermediate_size, config.num_heads) == (12, 768, 3072, 12)
        assert config.dropout == config.attention_dropout == 0.1
    else:
        net = RobertaMaskedLM(config)
        assert len(net.roberta.encoder.layer) == config.num_layers


@pytest.mark.parametrize("trainer", group_options("trainer"))
def test_every_trainer_instantiates(tmp_path, trainer):
    cfg = compose("train", [f"run_dir={tmp_path}", f"trainer={trainer}", "trainer.accelerator=cpu"])
    t = hydra.utils.instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
    assert t.max_steps == cfg.trainer.max_steps


@pytest.mark.parametrize("data", group_options("data"))
def test_every_data_config_instantiates(tmp_path, data):
    overrides = [f"run_dir={tmp_path}", f"data={data}"]
    if data == "files":
        (tmp_path / "a.txt").write_text("one line\n")
        overrides.append(f"data.files=[{tmp_path}/a.txt]")
    cfg = compose("train", overrides)
    dm = hydra.utils.instantiate(cfg.data)
    assert dm.block_size == cfg.data.block_size


def test_module_callbacks_and_loggers_instantiate(tmp_path):
    cfg = compose("train", [f"run_dir={tmp_path}"])
    config = hydra.utils.instantiate(cfg.model, vocab_size=300)
    module = hydra.utils.instantiate(cfg.module, model=config)
    opt = module.configure_optimizers()
    assert opt["optimizer"].defaults["betas"] == (0.9, 0.98) and opt["optimizer"].defaults["eps"] == 1e-6
    # no weight decay on LayerNorm parameters and biases
    plain = opt["optimizer"].param_groups[1]
    assert plain["weight_decay"] == 0.0 and all(p.dim() == 1 for p in plain["params"])
    for group in ("callbacks", "logger"):
        for c in cfg[group].values():
            assert hydra.utils.instantiate(c) is not None


@pytest.mark.parametrize("devices,expected", [(1, 8), (4, 2), (8, 1)])
def test_paper_experiment_is_table_4(tmp_path, devices, expected):
    cfg = compose("train", [f"run_dir={tmp_path}", "experiment=paper_roberta_base", f"trainer.devices={devices}"])
    c = OmegaConf.to_container(cfg, resolve=True)
    assert c["trainer"]["accumulate_grad_batches"] == expected  # 32 per device x devices x accumulation = 256
    assert c["data"]["batch_size"] * devices * expected == 256
    assert c["trainer"]["max_steps"] == 200_000 and c["trainer"]["gradient_clip_val"] == 0.5
    assert c["module"]["optimizer"]["lr"] == 1e-4 and c["module"]["scheduler"]["num_warmup_steps"] == 10_000
    assert c["module"]["optimizer"]["weight_decay"] == 0.01 and c["module"]["optimizer"]["eps"] == 1e-6
    assert c["model"]["hidden_size"] == 768 and c["model"]["num_layers"] == 12


@pytest.mark.parametrize("group", ["encoder", "task", "transform"])
def test_every_probe_option_composes(group):
    for option in group_options(group):
        cfg = compose("probe", [f"{group}={option}"])
        c = OmegaConf.to_container(cfg, resolve=True)
        assert group in c and c["seed"] == 0


@pytest.mark.parametrize("group", ["encoder", "transform", "wic", "sts", "ablation", "frequency", "attention_sinks",
                                   "frequent_tokens", "qk_outliers"])
def test_every_evaluate_option_composes(group):
    from outlierlab.evaluation.registry import ANALYSIS_MODULES

    for option in group_options(group):
        cfg = compose("evaluate", [f"{group}={option}"])
        c = OmegaConf.to_container(cfg, resolve=True)
        assert set(c["analyses"]) <= set(ANALYSIS_MODULES)


def test_evaluate_default_compares_all_three_transforms():
    cfg = compose("evaluate")
    assert {k for k, v in cfg.transform.use.items() if v} == {"none", "clip", "whiten"}


@pytest.mark.parametrize("overrides, expected", [
    (["trainer=gpu"], {"accelerator": "gpu", "devices": 1, "precision": "bf16-mixed", "strategy": "auto"}),
    (["trainer=ddp", "trainer.devices=4"], {"accelerator": "auto", "devices": 4, "strategy": "ddp"}),
    (["experiment=paper_roberta_base", "trainer=ddp", "trainer.devices=8"],
     {"strategy": "ddp", "devices": 8, "precision": "bf16-mixed", "accumulate_grad_batches": 1}),
])
def test_gpu_and_ddp_configs_compose_and_validate(tmp_path, overrides, expected):
    """GPU readiness on CPU: the accelerator configs pass the start-up validation unchanged."""
    from outlierlab.jobs.startup import check_train_config

    cfg = compose("train", [f"run_dir={tmp_path}", *overrides])
    assert check_train_config(cfg) == []
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert {k: trainer[k] for k in expected} == expected


@pytest.mark.slow
def test_bf16_mixed_trains_on_cpu_and_resumes_exactly(tmp_path, shared_cache):
    """bf16 autocast (the GPU configs' precision) on CPU: finite losses, and 10 + resume to 20 == 20 straight."""
    import math

    from outlierlab.jobs.training import train
    from tests.run_fixtures import small_cfg, train_losses

    common = ["trainer.precision=bf16-mixed", "trainer.limit_val_batches=0", "module.scheduler.num_warmup_steps=4",
              "module.scheduler.num_training_steps=20",  # one LR curve for the 10-step session and the 20-step run
              "callbacks.model_checkpoint.every_n_train_steps=10", "export=false"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(small_cfg(straight, "trainer.max_steps=20", *common))
    train(small_cfg(resumed, "trainer.max_steps=10", *common))
    train(small_cfg(resumed, "trainer.max_steps=20", "ckpt_path=last", *common))
    a, b = train_losses(straight), train_losses(resumed)
    assert sorted(b) == list(range(20)) and all(math.isfinite(v) for v in a.values())
    assert a[19] < a[0]  # it learns under autocast
    for step in range(10, 20):
        assert b[step] == pytest.approx(a[step], abs=1e-5), step
