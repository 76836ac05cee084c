"""The Lightning monitors and the progress lines check their cadence and switches as ol.OutlierMonitor does
(:mod:`outlierlab.monitoring.arguments`): ``every_n_steps="5"``, ``2.7`` (recorded every 2 steps), ``True``
(every step) and ``vectors="no"`` (true) were coerced by ``int()``/``bool()`` and ran; from train.py they are the
``callbacks.*`` keys, given on the command line as ``abc``, ``2.7`` or a quoted ``'5'``."""

from __future__ import annotations

import hydra
import pytest

from conftest import compose
from outlierlab.jobs.run_errors import error_line, is_user_error
from outlierlab.monitoring.hidden_state_monitor import HiddenStateMonitor
from outlierlab.monitoring.layernorm_monitor import LayerNormMonitor
from outlierlab.lightning_modules.callbacks.progress_lines import ProgressLines

BAD = [
    ({"every_n_steps": "5"}, TypeError, r"^every_n_steps must be an integer >= 1, got '5' \(str\)$"),
    ({"every_n_steps": 2.7}, TypeError, r"^every_n_steps must be an integer >= 1, got 2\.7 \(float\)$"),
    ({"every_n_steps": True}, TypeError, r"^every_n_steps must be an integer >= 1, got True \(bool\)$"),
    ({"every_n_steps": 0}, ValueError, r"^every_n_steps must be an integer >= 1, got 0 \(int\)$"),
    ({"image_every_n_steps": "100"}, TypeError, r"^image_every_n_steps must be an integer >= 1, got '100'"),
    ({"image_every_n_steps": 10.0}, TypeError, r"^image_every_n_steps must be an integer >= 1, got 10\.0"),
    ({"vectors": "no"}, TypeError, r"^vectors must be True or False, got 'no' \(str\)$"),
    ({"vectors": 0}, TypeError, r"^vectors must be True or False, got 0 \(int\)$"),
    ({"out_dir": 3}, TypeError, r"^out_dir must be a path \(str or os\.PathLike\) or None, got 3 \(int\)$"),
]


@pytest.mark.parametrize("monitor", [LayerNormMonitor, HiddenStateMonitor])
@pytest.mark.parametrize(("kwargs", "error", "says"), BAD, ids=[f"{k}={v!r}" for kw, _, _ in BAD
                                                                   for k, v in kw.items()])
def test_the_lightning_monitors_refuse_a_coerced_setting_in_one_line(monitor, kwargs, error, says):
    with pytest.raises(error, match=says) as e:
        monitor(**kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value, error", [("5", TypeError), (2.7, TypeError), (True, TypeError), (0, ValueError)])
def test_the_progress_lines_refuse_a_coerced_cadence(value, error):
    with pytest.raises(error, match=rf"^every_n_steps must be an integer >= 1, got {value!r}"):
        ProgressLines(every_n_steps=value)


def test_good_settings_are_kept_as_given(tmp_path):
    import numpy as np

    m = LayerNormMonitor(out_dir=tmp_path, every_n_steps=np.int64(5), image_every_n_steps=10, vectors=np.bool_(False))
    assert (m.every_n_steps, m.image_every_n_steps, m.vectors, m.out_dir) == (5, 10, False, tmp_path)
    assert type(m.every_n_steps) is int and type(m.vectors) is bool
    assert ProgressLines(every_n_steps=np.int64(3)).every_n_steps == 3
    assert HiddenStateMonitor().out_dir is None  # the trainer's default_root_dir/monitor, found at train start


@pytest.mark.parametrize("override, says", [
    ("callbacks.hidden_state_monitor.every_n_steps=abc", "every_n_steps must be an integer >= 1, got 'abc' (str)"),
    ("callbacks.hidden_state_monitor.every_n_steps=2.7", "every_n_steps must be an integer >= 1, got 2.7 (float)"),
    ("callbacks.layernorm_monitor.image_every_n_steps='100'",
     "image_every_n_steps must be an integer >= 1, got '100' (str)"),
    ("callbacks.progress.every_n_steps=1.5", "every_n_steps must be an integer >= 1, got 1.5 (float)"),
])
def test_train_py_callback_keys_of_the_wrong_type_are_one_line_naming_the_key(override, says, tmp_path):
    """What train.py does with ``cfg.callbacks`` (``hydra.utils.instantiate`` of each): a user error whose line
    names the setting and the config key to change (run_errors.error_line, the line train.py prints)."""
    cfg = compose("train", [override, f"run_dir={tmp_path}"])
    key = override.split("=")[0].rsplit(".", 1)[0]
    with pytest.raises(Exception) as e:
        hydra.utils.instantiate(cfg.callbacks[key.split(".")[1]])
    line = error_line(e.value)
    assert is_user_error(e.value) and "\n" not in line
    assert line.startswith(f"TypeError: {says}") and f"(in {key}: change it with" in line, line
