"""Where the Hydra configs live (``CONFIG_DIR``) and the command line's overrides, checked before Hydra composes
anything and before any heavy import.

``python train.py pos=nope`` or ``trainer.max_step=10`` fails within a second with one line (the valid names, or the
closest keys); an unwritable ``hydra.run.dir=`` fails before training.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf, open_dict

#: The Hydra configs: the copy a wheel carries inside the package (setup.py) if there is one, else the repository's
#: ``configs/`` beside train.py (a clone, an editable install).  The packaged copy is looked for first because a
#: wheel's ``parents[2]`` is site-packages, where another distribution may have put a ``configs/`` of its own.
_PACKAGED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CONFIG_DIR = _PACKAGED_CONFIGS if _PACKAGED_CONFIGS.is_dir() else Path(__file__).resolve().parents[2] / "configs"


def group_options(group: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    """Names of the option files of a config group (``configs/<group>/*.yaml``)."""
    return sorted(p.stem for p in (config_dir / group).glob("*.yaml"))


def find_override_errors(argv: list[str], config_dir: Path = CONFIG_DIR) -> list[str]:
    """One message per ``group=value`` override whose value is not a file of that group."""
    errors = []
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if "." in key or "/" in key or not (config_dir / key).is_dir():
            continue
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):  # list-valued choice, e.g. transform=[none,clip]
            value = value[1:-1]
        valid = group_options(key, config_dir)
        for choice in filter(None, (v.strip() for v in value.split(","))):
            if choice not in valid and choice != "null":
                errors.append(f"unknown {key} {choice!r}; valid: {', '.join(valid)}")
    return errors


#: Keys a user of another tool types for the output directory, which Hydra owns here (``hydra.run.dir=``).
_OUTPUT_DIR_KEYS = ("run_dir", "out_dir", "output_dir", "outdir", "save_dir")


def _config_keys(node, prefix: str = "") -> list[str]:
    """Every dotted key of a composed config, values left unresolved (``${hydra:...}`` has no value here)."""
    keys = []
    for k in node.keys():
        child = node._get_node(k)
        keys.append(f"{prefix}{k}")
        if OmegaConf.is_dict(child) and not child._is_none() and not child._is_missing():
            keys += _config_keys(child, f"{prefix}{k}.")
    return keys


def _has_key(cfg, key: str) -> bool:
    node = cfg
    for part in key.split("."):
        if OmegaConf.is_list(node) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
        elif OmegaConf.is_dict(node) and not node._is_none() and part in node.keys():
            node = node._get_node(part)
        else:
            return False
    return True


def find_key_errors(argv: list[str], config_name: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    """One line per override whose key the composed config lacks (with the closest keys), and per switch given
    anything but ``true``/``false`` (``resume=no`` is a true string); ``+``/``~`` and ``hydra.*`` left to Hydra."""
    composing, keys = [], []  # what the config is composed with; the keys to look up in it
    for arg in argv:
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
            continue
        key, value = arg.split("=", 1) if "=" in arg else (arg, "")
        bare = key.lstrip("+~")
        if bare.startswith("hydra.") or "/" in bare or "@" in bare:
            continue
        if "." not in bare and (config_dir / bare).is_dir():  # a group choice: the first of a sweep list
            composing.append(arg if value.strip().startswith("[") else f"{key}={value.split(',')[0]}")
        elif key != bare:  # +key=, ++key=, ~key: Hydra's to add or delete, and may add keys others set
            composing.append(arg)
        else:
            keys.append((key, arg))
    if not keys:
        return []
    from difflib import get_close_matches

    from hydra import compose, initialize_config_dir

    from outlierlab.configuration.settings_store import register_defaults

    register_defaults()  # the presets start from the sections' defaults
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = compose(config_name, overrides=composing, return_hydra_config=True)
    except Exception:  # noqa: BLE001 - a composition error is Hydra's to report, with its own message
        return []
    # the group options chosen, an experiment's overrides included (data=order_task under experiment=order_task)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    known, errors = None, []
    for key, arg in keys:
        if _has_key(cfg, key):
            errors += _switch_error(cfg, key, arg)
            continue
        known = known if known is not None else _config_keys(cfg)
        close = get_close_matches(key, known, n=3, cutoff=0.75)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        if key in _OUTPUT_DIR_KEYS:
            hint = "; the run's output directory is hydra.run.dir=<dir>"
        elif not close:
            hint = _other_options_hint(config_dir, choices, key)
        errors.append(f"unknown setting {key!r}{hint} (`python {config_name}.py --cfg job` lists every setting)")
    return errors


def _other_options_hint(config_dir: Path, choices: dict, key: str) -> str:
    """The options of a key's group that have it (``data.files`` under ``data=embedded``); "" when none."""
    group, _, rest = key.partition(".")
    if not rest or not (config_dir / group).is_dir():
        return ""
    having = []
    for option in sorted((config_dir / group).glob("*.yaml")):
        try:
            node = OmegaConf.load(option)
        except Exception:  # noqa: BLE001 - an unreadable option cannot be suggested
            continue
        *parents, leaf = rest.split(".")
        parent = OmegaConf.select(node, ".".join(parents), default=None) if parents else node
        if hasattr(parent, "keys") and leaf in parent.keys():  # a key whose value is ??? counts: the option has it
            having.append(option.stem)
    if not having:
        return ""
    chosen = choices.get(group)
    now = f"{group}={chosen} has no {rest}" if isinstance(chosen, str) else f"the {group} option chosen has no {rest}"
    return f"; {now}: the {group} options with it are {', '.join(having)} (e.g. {group}={having[0]} {key}=...)"


def _switch_error(cfg, key: str, arg: str) -> list[str]:
    """``[line]`` when ``key`` is a switch (its default true or false) and ``arg`` gives it anything else."""
    node = cfg
    for part in key.split("."):
        node = node._get_node(int(part) if OmegaConf.is_list(node) else part)
    if not isinstance(node._value(), bool):
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    override = OverridesParser.create().parse_overrides([arg])[0]
    values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    bad = [v for v in values if not isinstance(v, bool) and not str(v).startswith("${")]  # interpolations resolve later
    return [f"{key} must be true or false, got {bad[0]!r}"] if bad else []


def unwritable_run_dir(path: Path) -> str | None:
    """One line if the run directory ``path`` cannot be created or written (a file is written and removed)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_test-{os.getpid()}"  # per process: a second start on it does not collide
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as e:
        return f"run directory {path} is not writable ({e.strerror}); choose another with hydra.run.dir="
    return None


def check_overrides(argv: list[str] | None = None, config_dir: Path = CONFIG_DIR, config_name: str | None = None) -> None:
    """Exit with status 2 and one line per bad group choice, unknown setting or unusable run directory."""
    argv = sys.argv[1:] if argv is None else argv
    errors = find_override_errors(argv, config_dir)
    if config_name is not None and not errors:  # a wrong group choice first: the keys depend on the groups
        errors += find_key_errors(argv, config_name, config_dir)
    if "-m" not in argv and "--multirun" not in argv:  # a hydra.run.dir= that cannot be created or written, said
        # now rather than at the first checkpoint
        dirs = [Path(arg.split("=", 1)[1].strip("'\"")) for arg in argv if arg.startswith("hydra.run.dir=")]
        errors += list(itertools.islice(filter(None, map(unwritable_run_dir, dirs)), 1))
    if errors:
        for e in errors:
            print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
