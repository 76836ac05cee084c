"""Every setting of the monitors is checked when the monitor is made: a wrong type or range is one line naming the
argument (it used to be coerced: ``every_n_steps="5"`` ran, ``2.7`` recorded every 2 steps, ``vectors="no"`` was
true, a bare string as ``sentences`` made its characters the held-out batch)."""

from __future__ import annotations

import numpy as np
import pytest

from outlierlab.monitoring.hidden_state_monitor import HiddenStateMonitor
from outlierlab.monitoring.layernorm_monitor import LayerNormMonitor
from outlierlab.monitoring.hf_trainer import OutlierMonitorCallback
from outlierlab.monitoring.loop_monitor import OutlierMonitor

BAD = [
    ({"every_n_steps": "5"}, TypeError, r"^every_n_steps must be an integer >= 1, got '5' \(str\)$"),
    ({"every_n_steps": 2.7}, TypeError, r"^every_n_steps must be an integer >= 1, got 2\.7 \(float\)$"),
    ({"every_n_steps": True}, TypeError, r"^every_n_steps must be an integer >= 1, got True \(bool\)$"),
    ({"every_n_steps": 0}, ValueError, r"^every_n_steps must be an integer >= 1, got 0 \(int\)$"),
    ({"image_every_n_steps": "100"}, TypeError, r"^image_every_n_steps must be an integer >= 1"),
    ({"vectors": "no"}, TypeError, r"^vectors must be True or False, got 'no' \(str\)$"),
    ({"figures": 0}, TypeError, r"^figures must be True or False"),
    ({"layernorm": "false"}, TypeError, r"^layernorm must be True or False"),
    ({"hidden_states": None}, TypeError, r"^hidden_states must be True or False"),
    ({"histograms": "yes"}, TypeError, r"^histograms must be True or False"),
    ({"order_use": 1}, TypeError, r"^order_use must be True or False"),
    ({"max_steps": "1000"}, TypeError, r"^max_steps must be an integer or None, got '1000' \(str\)$"),
    ({"sentences": "The sea was calm."}, TypeError,
     r"^sentences is a single str \('The sea was calm\.'\): pass a list of sentences, e\.g\. sentences=\[text\]$"),
    ({"sentences": ["a sentence", 3]}, TypeError,
     r"^sentences has 1 item\(s\) that are not strings: \[1\] int; pass sentences \(str\)$"),
    ({"sentences": []}, ValueError, r"^sentences is empty: pass at least one non-empty sentence \(or None for the"),
    ({"rule": "kovaleva"}, TypeError, r"^rule must be a LayerNormRule, a mapping of its keys"),
    ({"ln_top_k": 0}, ValueError, r"^ln_top_k must be an integer >= 1, got 0"),
    ({"max_heatmap_rows": 1}, ValueError, r"^max_heatmap_rows must be an integer >= 2, got 1"),
    ({"n_sequences": 1}, ValueError, r"^n_sequences must be an integer >= 2, got 1"),
    ({"n_sequences": 32.0}, TypeError, r"^n_sequences must be an integer >= 2, got 32\.0 \(float\)$"),
    ({"sentences_path": 7}, TypeError, r"^sentences_path must be a path \(str or os\.PathLike\) or None"),
    ({"max_length": 1}, ValueError, r"^max_length must be an integer >= 2 or None, got 1"),
    ({"top_k": -1}, ValueError, r"^top_k must be an integer >= 1, got -1"),
    ({"n_pairs": 0}, ValueError, r"^n_pairs must be an integer >= 1, got 0"),
    ({"seed": "0"}, TypeError, r"^seed must be an integer >= 0, got '0'"),
    ({"sink_threshold": 30}, ValueError, r"^sink_threshold must be a number in \(0, 1\], got 30 \(int\)$"),
    ({"sink_threshold": 0.0}, ValueError, r"^sink_threshold must be a number in \(0, 1\]"),
    ({"sink_threshold": float("nan")}, ValueError, r"^sink_threshold must be a number in \(0, 1\]"),
    ({"writer": True}, TypeError, r"^writer must be a SummaryWriter-like object"),
    ({"global_zero": "yes"}, TypeError, r"^global_zero must be True or False"),
    ({"warn": "loud"}, TypeError, r"^warn must be callable"),
    ({"out_dir": 3}, TypeError, r"^out_dir must be a path \(str or os\.PathLike\), got 3 \(int\)$"),
    # an empty sentence was a row of padding between special tokens, measured as a held-out sentence
    ({"sentences": ["a sentence", " ", "another", ""]}, ValueError,
     r"^sentences has 2 empty or blank item\(s\): \[1\], \[3\]; drop them$"),
    # a name failed at the first record as "'str' object is not callable"
    ({"tokenizer": "bert-base-uncased"}, TypeError, r"^tokenizer='bert-base-uncased' is a name: pass the tokenizer "
                                                    r"itself, e\.g\. tokenizer=AutoTokenizer\.from_pretrained"),
    ({"tokenizer": 42}, TypeError, r"^tokenizer must be a Hugging Face tokenizer \(callable\) or None, got 42"),
    # a monitor switched off has its settings checked all the same: the typo bites when it is switched on
    ({"hidden_states": False, "n_pairs": 0}, ValueError, r"^n_pairs must be an integer >= 1"),
]


@pytest.mark.parametrize(("kwargs", "error", "says"), BAD, ids=[next(iter(k)) + f"={list(k.values())[-1]!r}"
                                                                   for k, _, _ in BAD])
def test_the_loop_monitor_refuses_a_bad_setting_in_one_line_naming_it(tmp_path, kwargs, error, says):
    kwargs = {"out_dir": tmp_path, **kwargs}
    with pytest.raises(error, match=says) as e:
        OutlierMonitor(**kwargs)
    assert "\n" not in str(e.value)
    assert not any(tmp_path.iterdir())  # refused before anything is written


@pytest.mark.parametrize(("kwargs", "error", "says"),
                         [(k, e, s) for k, e, s in BAD if not {"out_dir", "global_zero", "max_steps"} & set(k)])
def test_the_trainer_callback_refuses_the_same_settings_when_it_is_made(kwargs, error, says):
    # not at on_train_begin, after the Trainer has built its model, optimizer and data
    with pytest.raises(error, match=says):
        OutlierMonitorCallback(**kwargs)


def test_the_lightning_monitors_share_the_trackers_checks():
    with pytest.raises(ValueError, match=r"^n_pairs must be an integer >= 1, got 0"):
        HiddenStateMonitor(out_dir="unused", n_pairs=0)
    with pytest.raises(TypeError, match=r"^max_length must be an integer >= 2 or None, got '128' \(str\)$"):
        HiddenStateMonitor(out_dir="unused", max_length="128")
    with pytest.raises(ValueError, match=r"^max_heatmap_rows must be an integer >= 2, got 0"):
        LayerNormMonitor(out_dir="unused", max_heatmap_rows=0)
    with pytest.raises(TypeError, match=r"^histograms must be True or False"):
        LayerNormMonitor(out_dir="unused", histograms="false")


def test_good_settings_are_kept_as_given(tmp_path):
    m = OutlierMonitor(out_dir=str(tmp_path), every_n_steps=np.int64(5), image_every_n_steps=10,
                       vectors=np.bool_(False), max_steps=-1, sentences=("The sea was calm.", "Anne walked."), rule={"k": 3}, ln_top_k=2,
                       max_heatmap_rows=2, max_length=None, sink_threshold=1, n_sequences=2, seed=0)
    assert (m.every_n_steps, m.image_every_n_steps, m.vectors, m.max_steps) == (5, 10, False, None)
    assert type(m.every_n_steps) is int and m.sentences == ["The sea was calm.", "Anne walked."]
    assert m.layernorm.rule.k == 3 and m.layernorm.top_k == 2 and m.hidden.sink_threshold == 1.0
    assert OutlierMonitor(out_dir=tmp_path, max_steps=400).max_steps == 400
    assert OutlierMonitorCallback(every_n_steps=7, n_pairs=10).every_n_steps == 7


# ------------------------------------------------------------ what a monitor meets after it is made
def _tiny_bert(positions: int = 32):
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from probe_fixtures import minilm_path

    tok = AutoTokenizer.from_pretrained(minilm_path())
    return BertForMaskedLM(BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=32,
                                      max_position_embeddings=positions)), tok


def test_an_out_dir_that_is_a_file_is_refused_when_the_monitor_is_made(tmp_path):
    # it failed at the first record, after the model was built and trained a step: "[Errno 17] File exists"
    (tmp_path / "monitor").write_text("a file")
    for make in (OutlierMonitor, OutlierMonitorCallback):
        with pytest.raises(ValueError) as e:
            make(out_dir=tmp_path / "monitor")
        assert str(e.value) == f"out_dir={str(tmp_path / 'monitor')!r} is a file: pass a directory (it is made if missing)"


def test_the_callback_names_an_unknown_setting_as_its_own():
    with pytest.raises(TypeError) as e:  # was "OutlierMonitor.__init__() got an unexpected keyword argument"
        OutlierMonitorCallback(every_n_step=5)
    assert str(e.value) == ("OutlierMonitorCallback got unknown setting(s) every_n_step; the settings are "
                            "OutlierMonitor's (help(ol.OutlierMonitor))")


@pytest.mark.parametrize("bad, error, says", [(-1, ValueError, r"got -1$"), ("3", TypeError, r"got '3' \(str\)$"),
                                              (1.5, TypeError, r"got 1\.5 \(float\)$"),
                                              (None, TypeError, r"got None")])
def test_a_step_that_is_not_a_whole_number_from_0_is_refused_before_anything_is_written(tmp_path, bad, error, says):
    # int(step) recorded 1.5 as step 1 and "3" as step 3; a negative step was recorded as one
    model, _ = _tiny_bert()
    monitor = OutlierMonitor(out_dir=tmp_path / "m", hidden_states=False, writer=False)
    for call in (monitor.step, monitor.record, monitor.start):
        with pytest.raises(error, match=r"^step must be an integer >= 0 \(the optimizer step\), " + says):
            call(model, bad)
    assert not (tmp_path / "m").exists()


def test_numpy_and_torch_integer_steps_are_steps(tmp_path):
    import torch

    model, _ = _tiny_bert()
    monitor = OutlierMonitor(out_dir=tmp_path / "m", hidden_states=False, writer=False, figures=False)
    try:
        assert monitor.step(model, np.int64(0)) and monitor.last_step == 0
        assert monitor.step(model, torch.tensor(50)) and monitor.last_step == 50
        assert type(monitor.last_step) is int
    finally:
        monitor.close()


def test_a_model_without_the_monitors_layers_is_refused_when_given_and_before_the_folder_is_touched(tmp_path):
    """A model the monitors cannot read (no registered family, no blocks) was found out at the first record: the
    folder was locked and made first. Given to the monitor, it is refused when the monitor is made."""
    import torch

    linear = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"^model_type 'Linear' is not in the model-family registry"):
        OutlierMonitor(linear, out_dir=tmp_path / "a", hidden_states=False)
    with pytest.raises(ValueError, match=r"^no named sites for Linear: model_type 'Linear' is not in the model-family"):
        OutlierMonitor(linear, tokenizer=lambda *a, **k: None, out_dir=tmp_path / "b", layernorm=False)
    monitor = OutlierMonitor(out_dir=tmp_path / "c", hidden_states=False, writer=False)
    with pytest.raises(ValueError, match=r"^model_type 'Linear' is not in the model-family registry"):
        monitor.step(linear, 0)
    assert not any(p.exists() for p in (tmp_path / "a", tmp_path / "b", tmp_path / "c"))
    assert not monitor.started


def test_a_max_length_beyond_the_models_positions_is_refused_when_the_batch_is_built(tmp_path):
    # the held-out batch was cut at max_length tokens and failed in BERT's embedding at the first record
    # ("The expanded size of the tensor (85) must match the existing size (32)")
    model, tok = _tiny_bert(positions=32)
    with pytest.raises(ValueError) as e:
        OutlierMonitor(model, tokenizer=tok, out_dir=tmp_path / "m", max_length=64, layernorm=False)
    assert str(e.value) == ("max_length=64 exceeds the 32 positions BertForMaskedLM has: pass max_length <= 32, or "
                            "None (the model's own)")
    monitor = OutlierMonitor(model, tokenizer=tok, out_dir=tmp_path / "m", max_length=32, layernorm=False)
    assert monitor.hidden.batch["input_ids"].shape[1] <= 32


def test_the_position_limit_is_the_table_a_model_has():
    from transformers import GPT2Config, GPT2Model, LlamaConfig, LlamaModel, RobertaConfig, RobertaModel

    from outlierlab.monitoring.hidden_state_tracker import position_limit

    small = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=50)
    assert position_limit(_tiny_bert(positions=40)[0]) == 40
    # RoBERTa's table starts after the padding index: 34 rows, pad_token_id 1 -> 32 positions
    assert position_limit(RobertaModel(RobertaConfig(max_position_embeddings=34, pad_token_id=1, **small))) == 32
    assert position_limit(GPT2Model(GPT2Config(n_positions=24, n_embd=16, n_layer=1, n_head=2, vocab_size=50))) == 24
    assert position_limit(LlamaModel(LlamaConfig(max_position_embeddings=64, **small))) is None  # rotary: no table
