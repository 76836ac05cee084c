"""Start-up checks for the Hydra entry points, importing nothing heavy.

``import lightning`` and ``import transformers`` take 10–15 s each on a small machine, and
Hydra's own message for an unknown config option is several lines long. The entry points call
:func:`check_overrides` first, so ``python train.py pos=nope`` fails within a second with one
line that lists the valid names.
"""

from __future__ import annotations

import os
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


def find_run_dir_error(argv: list[str]) -> str | None:
    """``hydra.run.dir=`` that cannot be created or written: say so now, not in a Hydra traceback
    (and not after an hour of training, when the first checkpoint is saved)."""
    for arg in argv:
        if arg.startswith("hydra.run.dir="):
            path = Path(arg.split("=", 1)[1].strip("'\""))
            try:
                path.mkdir(parents=True, exist_ok=True)
                probe = path / ".write_test"
                probe.write_bytes(b"x")
                probe.unlink()
            except OSError as e:
                return f"run directory {path} is not writable ({e.strerror}); choose another with hydra.run.dir="
    return None


def check_overrides(argv: list[str] | None = None, config_dir: Path = CONFIG_DIR) -> None:
    """Exit with status 2 and one line per bad ``group=value`` override or unusable run directory."""
    argv = sys.argv[1:] if argv is None else argv
    errors = find_override_errors(argv, config_dir)
    if "-m" not in argv and "--multirun" not in argv:
        run_dir_error = find_run_dir_error(argv)
        errors += [run_dir_error] if run_dir_error else []
    if errors:
        for e in errors:
            print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def register_resolvers() -> None:
    """OmegaConf resolvers used by the configs (idempotent)."""
    from omegaconf import OmegaConf

    def accumulation(global_batch: int, per_device: int, devices, num_nodes=1) -> int:
        # Paper batch 256 = per-device batch x devices x nodes x accumulation (Luo et al. Table 4).
        devices = 1 if devices in ("auto", None) else (len(devices) if isinstance(devices, (list, tuple)) else int(devices))
        per_step = int(per_device) * devices * int(num_nodes)
        if int(global_batch) % per_step:
            raise ValueError(f"global batch {global_batch} is not a multiple of {per_device} x {devices} devices x {num_nodes} nodes")
        return int(global_batch) // per_step

    if not OmegaConf.has_resolver("accumulation"):
        OmegaConf.register_new_resolver("accumulation", accumulation)


# Errors that mean "the user asked for something that cannot work": reported as one line.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, OSError, FloatingPointError)


def run_main(job, cfg):
    """Run ``job(cfg)``; a user error becomes ``error: <message>`` on stderr and exit status 1.

    Set ``OUTLIERLAB_DEBUG=1`` to get the full traceback instead.
    """
    try:
        return job(cfg)
    except USER_ERRORS as e:
        if os.environ.get("OUTLIERLAB_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(1)
