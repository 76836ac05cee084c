"""Every setting of the monitors is checked when the monitor is made: a wrong type or range is one line naming the
argument (it used to be coerced: ``every_n_steps="5"`` ran, ``2.7`` recorded every 2 steps, ``vectors="no"`` was
true, a bare string as ``sentences`` made its characters the held-out batch)."""

from __future__ import annotations

import numpy as np
import pytest

from outlierlab.lightning_modules.callbacks.hidden_state_monitor import HiddenStateMonitor
from outlierlab.lightning_modules.callbacks.layernorm_monitor import LayerNormMonitor
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
    ({"sentences": "The sea was calm."}, TypeError, r"^sentences must be a list of strings"),
    ({"sentences": ["a sentence", 3]}, TypeError, r"^sentences must be a list of strings .*element 3 \(int\)"),
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
