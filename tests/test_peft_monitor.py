"""The loop monitors on a PEFT (LoRA) fine-tune: a ``PeftModel`` wraps the transformers model and injects the adapters
into its linear layers, so the monitors read the adapted model inside it (``unwrap_model``), and the post-hoc job
rebuilds each adapter-only checkpoint -- base model plus adapter, merged -- to the same rows.

Tiny RoBERTa masked LM (2 layers, width 32), BPE trained on the shipped held-out sentences: nothing reaches a hub.
"""

from __future__ import annotations

import pytest

pytest.importorskip("peft")

from outlierlab.monitoring.history import read_history  # noqa: E402
from tests.loop_monitor_helpers import (SETTINGS, assert_matches_posthoc, blocks, by_step,  # noqa: E402
                                     perturb_layernorms, roberta_tok, tiny_roberta, train)

__all__ = ["roberta_tok"]  # the fixture, from tests/loop_monitor_helpers.py


@pytest.mark.slow
def test_a_lora_fine_tune_is_monitored_live_and_post_hoc_from_its_adapter_checkpoints(tmp_path, roberta_tok):
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorForLanguageModeling, RobertaForMaskedLM

    from outlierlab import OutlierMonitorCallback

    base = tiny_roberta(roberta_tok)
    perturb_layernorms(base)
    base.save_pretrained(tmp_path / "base")  # the adapter checkpoints name it as their base_model_name_or_path
    roberta_tok.save_pretrained(tmp_path / "base")
    model = get_peft_model(RobertaForMaskedLM.from_pretrained(tmp_path / "base"),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]))
    callback = OutlierMonitorCallback(tokenizer=roberta_tok, every_n_steps=2, image_every_n_steps=3, figures=False,
                                      writer=False, **SETTINGS)
    collator = DataCollatorForLanguageModeling(roberta_tok, mlm_probability=0.15)
    train(model, roberta_tok, tmp_path / "run", collator, blocks(roberta_tok, mlm=True), callback)

    assert (tmp_path / "run" / "checkpoint-3" / "adapter_config.json").is_file()
    assert not (tmp_path / "run" / "checkpoint-3" / "config.json").is_file()  # the adapter alone, not the model
    live = by_step(read_history(tmp_path / "run" / "monitor" / "hidden_states.csv"))
    assert sorted(live) == [0, 2, 3, 4, 6]
    assert any(k[1] == "order_use" for k in live[6])  # the masked LM's head came through the wrapper
    # LoRA starts as the identity (B = 0) and is trained: the adapted model moves, the frozen LayerNorms do not
    assert live[6][("layer_2", "kurtosis", None)] != live[0][("layer_2", "kurtosis", None)]
    layernorm = by_step(read_history(tmp_path / "run" / "monitor" / "layernorm.csv"))
    gains = [k for k in layernorm[6] if k[1] == "max_abs_gain_div"]
    assert gains and all(layernorm[6][k] == layernorm[0][k] for k in gains)
    assert_matches_posthoc(tmp_path / "run", [3, 6], roberta_tok)


def test_an_adapter_checkpoint_whose_base_is_gone_fails_in_one_line(tmp_path, roberta_tok, capsys):
    from peft import LoraConfig, get_peft_model

    from outlierlab.jobs import posthoc

    from transformers import RobertaForMaskedLM

    tiny_roberta(roberta_tok).save_pretrained(tmp_path / "base")
    lora = get_peft_model(RobertaForMaskedLM.from_pretrained(tmp_path / "base"),
                          LoraConfig(r=2, target_modules=["query"]))
    lora.save_pretrained(tmp_path / "run" / "checkpoint-3")
    (tmp_path / "base").rename(tmp_path / "moved")
    capsys.readouterr()
    assert posthoc.main([str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"base model {tmp_path / 'base'} is not there" in err, err
