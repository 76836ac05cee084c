"""Start-up validation of config-group overrides (before any heavy import)."""

from outlierlab.jobs.startup import find_override_errors, group_options


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
        "unknown model 'huge'; valid: base, small, tiny",
    ]
