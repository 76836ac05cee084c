"""Start-up checks for the Hydra entry points, importing nothing heavy.

``import lightning`` and ``import transformers`` take 10–15 s each on a small machine, and
Hydra's own message for an unknown config option is several lines long. The entry points call
:func:`check_overrides` first, so ``python train.py pos=nope`` fails within a second with one
line that lists the valid names.
"""

from __future__ import annotations

import sys
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def group_options(group: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    """Names of the option files of a config group (``configs/<group>/*.yaml``)."""
    return sorted(p.stem for p in (config_dir / group).glob("*.yaml"))


def find_override_errors(argv: list[str], config_dir: Path = CONFIG_DIR) -> list[str]:
    """One message per ``group=value`` override whose value is not a file of that group.

    Handles Hydra's ``+group=``/``++group=`` prefixes and multirun lists (``pos=a,b``).
    Dotted keys (``trainer.devices=2``) are values, not group choices, and are left to Hydra.
    """
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


def check_overrides(argv: list[str] | None = None, config_dir: Path = CONFIG_DIR) -> None:
    """Exit with status 2 and one line per bad ``group=value`` override."""
    errors = find_override_errors(sys.argv[1:] if argv is None else argv, config_dir)
    if errors:
        for e in errors:
            print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
