"""Where the Hydra configs live and how they are composed: ``compose_config`` (the command line's composition,
from Python), the resolvers the configs use (``register_resolvers``) and the sweep cells' directory names.

``register_resolvers`` also runs at import: launcher workers resolve ``${cell_dir:...}`` without running
``train.py``'s module code.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from outlierlab.configuration.overrides import CONFIG_DIR


#: Longest multirun cell directory name written as is (file systems allow 255 bytes per name).
CELL_NAME_MAX = 150


def cell_dir_name(override_dirname: str, limit: int = CELL_NAME_MAX) -> str:
    """A sweep cell's directory name: its overrides, readable and stable (``/`` written ``%2F``).  Beyond ``limit``
    characters it is cut at an override boundary, ``seed=`` kept, with a 10-hex digest of the full name."""
    import hashlib

    if not override_dirname:  # a sweep cell with nothing but excluded overrides (e.g. -m experiment=x)
        return "default"
    # a '/' in a value (a hub id, a path) would nest the cell in sub-directories, where neither a rerun's
    # skip nor the study aggregator finds it (Hydra issue #3018): written as %2F, one directory per cell
    override_dirname = override_dirname.replace("/", "%2F")
    if len(override_dirname) <= limit:
        return override_dirname
    digest = hashlib.sha1(override_dirname.encode()).hexdigest()[:10]
    seed = next((item for item in override_dirname.split(",") if item.startswith("seed=")), None)
    keep = limit - len(digest) - 1 - (len(seed) + 1 if seed else 0)
    prefix = override_dirname[:keep].rsplit(",", 1)[0]
    return ",".join(x for x in (prefix, seed, digest) if x)


def cell_overrides(task, exclude_keys, item_sep: str = ",", kv_sep: str = "=") -> str:
    """Hydra's ``override_dirname`` of a cell's overrides, except that an excluded key also excludes every key under
    it (``posthoc_probe`` drops ``posthoc_probe.max_sentences=200``): Hydra 1.3 has no wildcard (issue #1873)."""
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser

    excluded = [str(k) for k in exclude_keys]

    def is_excluded(key: str) -> bool:
        return any(key == k or key.startswith((k + ".", k + "/")) for k in excluded)

    lines = sorted(o.input_line for o in OverridesParser.create().parse_overrides([str(t) for t in task])
                   if not is_excluded(o.key_or_group))
    return re.sub("=", kv_sep, item_sep.join(lines))


def _cell_dir(overrides, naming=None) -> str:
    """``${cell_dir:${hydra.overrides.task},${hydra.job.config.override_dirname}}`` (configs/train.yaml)."""
    if naming is None:
        raise ValueError("${cell_dir:...} takes two arguments: ${hydra.overrides.task},"
                         "${hydra.job.config.override_dirname} (configs/train.yaml)")
    return cell_dir_name(cell_overrides(list(overrides), list(naming.get("exclude_keys") or []),
                                        str(naming.get("item_sep", ",")), str(naming.get("kv_sep", "="))))


def register_resolvers() -> None:
    """OmegaConf resolvers used by the configs, and the sections' defaults; idempotent."""
    def accumulation(global_batch: int, per_device: int, devices, num_nodes=1) -> int:
        # Paper batch 256 = per-device batch x devices x nodes x accumulation (Luo et al. Table 4).
        devices = 1 if devices in ("auto", None) else (len(devices) if isinstance(devices, (list, tuple)) else int(devices))
        per_step = int(per_device) * devices * int(num_nodes)
        if int(global_batch) % per_step:
            raise ValueError(f"global batch {global_batch} is not a multiple of {per_device} x {devices} devices x {num_nodes} nodes")
        return int(global_batch) // per_step

    if not OmegaConf.has_resolver("accumulation"):
        OmegaConf.register_new_resolver("accumulation", accumulation)
    if not OmegaConf.has_resolver("cell_dir"):
        OmegaConf.register_new_resolver("cell_dir", _cell_dir)
    if not OmegaConf.has_resolver("lr_scale"):  # configs/optimizer/lion.yaml: a rate as a multiple of the recipe's
        OmegaConf.register_new_resolver("lr_scale", lambda lr, factor: float(lr) * float(factor))
    from outlierlab.configuration.settings_store import register_defaults  # light: no torch

    register_defaults()  # the sections' defaults (ConfigStore) that every preset of them starts from


def compose_config(config_name: str, overrides=()):
    """``configs/<config_name>.yaml`` composed with ``overrides``; a caller's Hydra state is put back after."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_resolvers()
    theirs = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
        if theirs is not None:
            GlobalHydra.instance().initialize(theirs)


register_resolvers()  # see the module's docstring: launcher workers need the resolvers too
