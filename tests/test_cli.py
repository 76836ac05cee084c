"""Start-up validation of config-group overrides (before any heavy import)."""

import pytest

from outlierlab.configuration.overrides import find_override_errors, group_options


def test_valid_overrides_pass():
    assert find_override_errors(["pos=none", "model=tiny", "trainer.max_steps=3", "seed=1"]) == []
    assert find_override_errors(["pos=learned,none,relative"]) == []


def test_unknown_group_value_gives_one_line_with_valid_names():
    errs = find_override_errors(["pos=learnd"])
    assert errs == ["unknown pos 'learnd'; valid: " + ", ".join(group_options("pos"))]
    assert "alibi, learned, none, relative, rope, sinusoidal" in errs[0]


def test_sweep_lists_are_checked_item_by_item():
    assert find_override_errors(["pos=learned,nope", "model=huge"]) == [
        "unknown pos 'nope'; valid: alibi, learned, none, relative, rope, sinusoidal",
        "unknown model 'huge'; valid: base, medium, small, tiny",
    ]


def test_unknown_setting_gives_one_line_with_the_closest_keys():
    """Hydra's message for a typo'd key is five lines and advises ``+key=``, which adds a key nothing reads."""
    from outlierlab.configuration.overrides import find_key_errors

    cfg_hint = "(`python train.py --cfg job` lists every setting)"
    assert find_key_errors(["trainer.max_step=10"], "train") == [
        f"unknown setting 'trainer.max_step'; did you mean trainer.max_steps or trainer.max_epochs? {cfg_hint}"]
    assert find_key_errors(["pos=none", "model.hidden_sise=64"], "train") == [
        f"unknown setting 'model.hidden_sise'; did you mean model.hidden_size? {cfg_hint}"]
    assert find_key_errors(["run_dir=/tmp/x"], "evaluate") == [
        "unknown setting 'run_dir'; the run's output directory is hydra.run.dir=<dir> "
        "(`python evaluate.py --cfg job` lists every setting)"]
    # a key another option of the group has: that option named, not a typo (was the bare "unknown setting")
    assert find_key_errors(["data.files=[a.txt]"], "train") == [
        "unknown setting 'data.files'; data=embedded has no files: the data options with it are english_large, "
        f"files (e.g. data=english_large data.files=...) {cfg_hint}"]
    assert find_key_errors(["data=order_task", "data.files=[a.txt]"], "train")[0].startswith(
        "unknown setting 'data.files'; data=order_task has no files")
    # the option an experiment chose (its `override /data: order_task`), not train.yaml's default
    assert find_key_errors(["experiment=order_task", "data.files=[a.txt]"], "train")[0].startswith(
        "unknown setting 'data.files'; data=order_task has no files")


def test_known_settings_pass_whatever_group_or_append_brings_them():
    from outlierlab.configuration.overrides import find_key_errors

    assert find_key_errors(["pos=learned,none", "model.hidden_size=64", "seed=1,2", "trainer.max_steps=3",
                              "hydra.run.dir=/tmp/x", "hydra/launcher=joblib", "-m"], "train") == []
    assert find_key_errors(["+foo=1", "foo=2"], "train") == []  # appended, then set: Hydra's to judge
    # a key of the run_dir-less evaluate config is unknown there, a key of the chosen wic preset is known
    assert find_key_errors(["wic=superglue", "wic.max_pairs=10"], "evaluate") == []
    assert find_key_errors(["run_dir=/tmp/x"], "train") == []  # train.py has one (set from hydra.run.dir)


def test_train_py_refuses_a_typo_in_one_line_before_any_heavy_import():
    import subprocess
    import sys

    from tests.conftest import ROOT

    r = subprocess.run([sys.executable, "train.py", "trainer.max_step=10"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: unknown setting 'trainer.max_step'; did you mean trainer.max_steps or trainer.max_epochs? "
        "(`python train.py --cfg job` lists every setting)"]


@pytest.mark.parametrize("config, override, message", [
    ("train", "resume=no", "resume must be true or false, got 'no'"),  # a string is true: it resumed
    ("train", "model.causal=yes", "model.causal must be true or false, got 'yes'"),
    ("train", "export=true,off", "export must be true or false, got 'off'"),  # a sweep: every value
    ("evaluate", "tensorboard=0", "tensorboard must be true or false, got 0"),
    ("probe", "probe.include_special=off", "probe.include_special must be true or false, got 'off'"),
])
def test_a_switch_given_a_word_is_refused_in_one_line(config, override, message):
    from outlierlab.configuration.overrides import find_key_errors

    assert find_key_errors([override], config) == [message]


def test_switches_given_true_or_false_and_other_keys_pass():
    from outlierlab.configuration.overrides import find_key_errors

    assert find_key_errors(["resume=false", "export=true,false", "data.num_workers=2", "seed=3",
                            "module.compile=auto", "posthoc=${oc.env:POSTHOC,false}"], "train") == []
