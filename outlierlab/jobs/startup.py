"""Start-up checks of the composed config for the Hydra entry points, importing nothing heavy.

``import lightning`` and ``import transformers`` take 10–15 s each on a small machine: a setting that cannot
work (``check_train_config``) fails before them, in one line.  Also here: the run plan line, sweep cell
names, Hydra's resolvers, the device check and Lightning's console.  The command line itself is checked
earlier, before Hydra composes, by ``outlierlab.jobs.overrides``.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
from pathlib import Path

from omegaconf import OmegaConf, open_dict

from outlierlab.jobs.overrides import CONFIG_DIR


def _target_error(target: str, where: str) -> str | None:
    """Whether ``module.attr`` of a Hydra ``_target_`` exists, without executing the module (no heavy import).

    The top-level package is located with ``find_spec``, submodules on its search path with ``PathFinder``;
    the attribute is checked only in this repository's own source files, where a missing name is a typo.
    """
    module, _, attr = str(target).rpartition(".")
    parts = module.split(".") if module else []
    spec = importlib.util.find_spec(parts[0]) if parts else None
    for part in parts[1:]:
        if spec is None or not spec.submodule_search_locations:
            spec = None
            break
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    if spec is None or not attr:
        return f"{where}._target_={target}: no module {module or target!r} (check the spelling)"
    origin = Path(spec.origin or "")
    if origin.suffix == ".py" and CONFIG_DIR.parent in origin.parents:
        names = set()
        for node in ast.parse(origin.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if attr not in names:
            return f"{where}._target_={target}: {module} has no {attr!r}"
    return None


def _as_int(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return int(value)


def _duration(value) -> bool:
    """Whether Lightning's ``Timer`` reads ``value`` as a duration string: ``DD:HH:MM:SS`` with two-digit hours,
    minutes and seconds (its own pattern). A mapping (``{hours: 2}``) reaches it as an OmegaConf node, which it
    cannot read, so it is refused here too."""
    return isinstance(value, str) and re.fullmatch(r"\d+:\d\d:\d\d:\d\d", value.strip()) is not None


#: ``data.*`` keys that only the masked objective reads (refused with ``objective=clm``).
MASKED_ONLY_DATA_KEYS = ("mlm_probability", "mask_replace_prob", "random_replace_prob")


def _check_objective(cfg) -> None:
    """``objective=clm`` with a masked-LM setting, or ``model.causal`` / ``data.objective`` edited apart from
    the objective group: one line each, before anything heavy loads."""
    objective = OmegaConf.select(cfg, "objective", default="mlm")
    if objective not in ("mlm", "clm"):
        raise ValueError(f"unknown objective {objective!r}; valid: clm, mlm (objective=clm)")
    causal = bool(OmegaConf.select(cfg, "model.causal", default=False))
    data_objective = OmegaConf.select(cfg, "data.objective", default="mlm")
    if causal != (objective == "clm") or data_objective != objective:
        raise ValueError(f"objective={objective} but model.causal={causal} and data.objective={data_objective}; "
                         "choose the objective with objective=mlm|clm alone (it sets both)")
    if objective == "clm":
        given = [k for k in MASKED_ONLY_DATA_KEYS if OmegaConf.select(cfg, f"data.{k}") is not None]
        if given:
            raise ValueError(f"data.{given[0]} is a masked-LM setting and objective=clm masks nothing; "
                             "drop the override (or use objective=mlm)")


def check_train_config(cfg) -> list[str]:
    """Validate the optimisation setup of a composed ``train.yaml`` before the heavy imports.

    Combinations that cannot work raise ``ValueError`` with one line; combinations with a sensible
    reading are adjusted in ``cfg`` and returned as one-line warnings (which the caller prints):

    * ``seed`` an integer, ``threads`` null or >= 1, ``lr`` and ``optimizer.lr`` > 0, ``trainer.max_time`` a duration;
    * ``trainer.max_steps`` must be >= 1 (``-1``, Lightning's "use max_epochs", would also make the
      schedule's length negative);
    * the scheduler's and optimizer's ``_target_`` must exist; the warm-up must be >= 0; a warm-up >=
      max_steps only warns (the schedule holds the peak, ``outlierlab.models.schedules``);
    * ``trainer.val_check_interval`` (batches) above the run's length is lowered to it: one validation at
      the end instead of none;
    * ``callbacks.model_checkpoint.every_n_train_steps`` must be >= 1 (0 saves nothing to resume from);
    * ``data.block_size`` must not exceed ``model.max_len``;
    * a clipped softmax that zeroes a uniform attention row warns (``clipped_softmax_warning``).
    """
    warnings: list[str] = []
    for key in ("resume", "skip_finished", "posthoc", "export"):
        value = cfg.get(key, False)
        if not isinstance(value, bool):  # resume=no is the string 'no', which reads as true (it would resume)
            raise ValueError(f"{key} must be true or false, got {value!r}")
    _check_objective(cfg)
    hidden, heads = OmegaConf.select(cfg, "model.hidden_size"), OmegaConf.select(cfg, "model.num_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads:
        # the same rule EncoderConfig enforces, said here before data and model load
        raise ValueError(f"model.hidden_size={hidden} is not divisible by model.num_heads={heads}; "
                         "change one of them (e.g. model.hidden_size=" + str(hidden - hidden % heads) + ")")
    _as_int(cfg.get("seed"), "seed")  # seed=abc failed after the data loaded, as int()'s "invalid literal"
    threads = cfg.get("threads")
    if threads is not None and _as_int(threads, "threads") < 1:  # 0 read as null: all cores, unasked
        raise ValueError(f"threads must be >= 1 or null (null: $OMP_NUM_THREADS, else the cores), got {threads}")
    for key in ("lr", "optimizer.lr"):
        lr = OmegaConf.select(cfg, key)
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0):
            raise ValueError(f"{key} must be a number > 0, got {lr!r}")  # torch's: "Invalid learning rate"
    trainer = cfg.trainer
    max_time = trainer.get("max_time")
    if max_time is not None and not _duration(max_time):  # Lightning's Timer refused it after the data loaded
        raise ValueError(f"trainer.max_time must be DD:HH:MM:SS (e.g. +trainer.max_time=00:02:00:00) or null, "
                         f"got {max_time!r}")
    max_steps = _as_int(trainer.max_steps, "trainer.max_steps")
    if max_steps <= 0:
        raise ValueError(f"trainer.max_steps must be >= 1 optimizer steps, got {max_steps} "
                         "(e.g. trainer.max_steps=300)")
    for key in ("optimizer", "module.scheduler"):
        node = OmegaConf.select(cfg, key)
        if node is not None and node.get("_target_"):
            error = _target_error(node._target_, key)
            if error:
                raise ValueError(error)
    sched = OmegaConf.select(cfg, "module.scheduler")
    if sched is not None and "num_warmup_steps" in sched:
        warmup = _as_int(sched.num_warmup_steps, "module.scheduler.num_warmup_steps")
        if warmup < 0:
            raise ValueError(f"module.scheduler.num_warmup_steps must be >= 0, got {warmup}")
        if warmup >= max_steps:
            warnings.append(f"warm-up ({warmup} steps) >= trainer.max_steps ({max_steps}): the learning rate "
                            "never decays" + (" and never reaches its peak" if warmup > max_steps else
                                              " (it holds the peak after the warm-up)"))
    accumulate = trainer.get("accumulate_grad_batches", 1)
    batches = max_steps * (accumulate if isinstance(accumulate, int) and accumulate > 0 else 1)
    vci = trainer.get("val_check_interval")
    if isinstance(vci, int) and not isinstance(vci, bool) and trainer.get("check_val_every_n_epoch") is None:
        if vci < 1:
            raise ValueError(f"trainer.val_check_interval must be >= 1 batches, got {vci}")
        if vci > batches:
            with open_dict(trainer):
                trainer.val_check_interval = batches
            warnings.append(f"trainer.val_check_interval={vci} exceeds the run ({batches} batches): "
                            f"validating once, at batch {batches}")
    every = OmegaConf.select(cfg, "callbacks.model_checkpoint.every_n_train_steps")
    if every is not None and _as_int(every, "callbacks.model_checkpoint.every_n_train_steps") < 1:
        raise ValueError(f"callbacks.model_checkpoint.every_n_train_steps must be >= 1, got {every} (0 never saves "
                         "a checkpoint to resume from; to save none use ~callbacks.model_checkpoint)")
    if every is not None and max_steps < int(every):
        warnings.append(f"trainer.max_steps={max_steps} is shorter than the checkpoint interval "
                        f"(callbacks.model_checkpoint.every_n_train_steps={every}): a kill before the end leaves only "
                        "what a SIGTERM saves, nothing after a SIGKILL; lower the interval to resume a short run")
    block, max_len = OmegaConf.select(cfg, "data.block_size"), OmegaConf.select(cfg, "model.max_len")
    if isinstance(block, int) and isinstance(max_len, int) and block > max_len:
        raise ValueError(f"data.block_size={block} is larger than the model's max_len={max_len}; "
                         "lower data.block_size or raise model.max_len")
    if OmegaConf.select(cfg, "model.attention") == "clipped_softmax" and isinstance(block, int):
        warning = clipped_softmax_warning(float(cfg.model.clip_gamma), float(cfg.model.clip_zeta), block)
        if warning:
            warnings.append(warning)
    return warnings


def clipped_softmax_warning(gamma: float, zeta: float, length: int) -> str | None:
    """One line when the clipped softmax zeroes a uniform attention row (None otherwise).

    ``clip((ζ-γ)·p + γ, 0, 1)`` is exactly 0, with zero gradient, for every ``p < -γ/(ζ-γ)``. Attention
    starts near uniform (``p ≈ 1/T``) when the initial logits are small, so if ``-γ/(ζ-γ) >= 1/T`` every
    probability is clipped at initialisation and the queries and keys get no gradient: attention may never
    switch on. We measured exactly that on the emergence_cpu model (d = 128, T = 64) at Bondarenko et al.'s
    BERT α (γ = -0.05): zero attention mass at every checkpoint (docs/emergence.md). BERT-base's larger
    initial logits make it less likely there, but the rule γ = -α/T does not account for the logit scale.
    """
    threshold = -gamma / (zeta - gamma)
    if threshold < 1.0 / length:
        return None
    return (f"model.clip_gamma={gamma:g} with {length}-token blocks: every attention probability below "
            f"{threshold:.3g} is clipped to exactly 0, {threshold * length:.1f}x the uniform 1/T = {1 / length:.3g} "
            f"— near-uniform attention at initialisation is zeroed and gets no gradient, so attention may "
            f"never switch on (watch monitor/hidden/layer_*/attn_row_mass); |gamma| < {1 / (length - 1):.3g} "
            f"keeps a uniform row alive")


def describe_plan(cfg) -> str:
    """One line saying what the run will do: steps, devices, global batch, tokens and precision.

    Printed before the heavy imports, so a misread multi-GPU setting (global batch, accumulation) shows
    before hours of compute, e.g. for ``experiment=paper_roberta_base`` (Luo et al. Table 4: batch 256).
    """
    t = cfg.trainer
    per_device = OmegaConf.select(cfg, "data.batch_size")
    block = OmegaConf.select(cfg, "data.block_size")
    devices, nodes, accumulate = t.get("devices", 1), int(t.get("num_nodes", 1) or 1), t.get("accumulate_grad_batches", 1)
    n_dev = len(devices) if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices) else devices
    line = f"plan: {t.max_steps} steps on {t.get('accelerator', 'auto')} x {n_dev} device(s) x {nodes} node(s)"
    if isinstance(n_dev, int) and isinstance(per_device, int) and isinstance(accumulate, int):
        global_batch = per_device * n_dev * nodes * accumulate
        line += (f", global batch {global_batch} = {per_device} per device x {n_dev * nodes} device(s) x "
                 f"{accumulate} accumulation")
        if isinstance(block, int):
            line += f", {global_batch * block:,} tokens/step, {global_batch * block * int(t.max_steps):,} tokens"
    return line + f", precision {t.get('precision', '32-true')}, strategy {t.get('strategy', 'auto')}"


#: Longest multirun cell directory name written as is (file systems allow 255 bytes per name).
CELL_NAME_MAX = 150


def cell_dir_name(override_dirname: str, limit: int = CELL_NAME_MAX) -> str:
    """A sweep cell's directory name: its overrides (``hydra.job.override_dirname``), readable and stable.

    A ``/`` inside a value (``tokenizer.name_or_path=FacebookAI/roberta-base``) is written ``%2F``.
    Beyond ``limit`` characters (a run with many overrides would exceed the file system's 255) the name
    is cut at an override boundary, the ``seed=`` item is kept, and a 10-hex digest of the full name keeps it
    unique; the full overrides stay in the cell's ``.hydra/overrides.yaml``, which is what the study aggregator
    reads.
    """
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
    """``hydra.job.override_dirname`` of a cell's overrides (``hydra.overrides.task``), except that an excluded key
    also excludes every key under it: ``posthoc_probe`` drops ``posthoc_probe.max_sentences=200`` and
    ``+posthoc_probe.overrides=[...]`` too.

    Hydra (1.3) compares ``exclude_keys`` with each override's whole key, and has no wildcard or pattern for them
    (Hydra issue #1873, open; the workaround suggested there is this one: build the name from
    ``hydra.overrides.task`` in a resolver). Listing each sub-key in ``exclude_keys`` instead would leak every
    sub-key added later, and a cell set up with one is a different directory, which a rerun would train again
    instead of skipping. Everything else is Hydra's own ``get_overrides_dirname``: its parser, each override's
    text as given, sorted, joined with ``item_sep``, every ``=`` written as ``kv_sep`` — so the names of cells
    without such sub-keys are what they were.
    """
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser

    excluded = [str(k) for k in exclude_keys]

    def is_excluded(key: str) -> bool:
        return any(key == k or key.startswith((k + ".", k + "/")) for k in excluded)

    lines = sorted(o.input_line for o in OverridesParser.create().parse_overrides([str(t) for t in task])
                   if not is_excluded(o.key_or_group))
    return re.sub("=", kv_sep, item_sep.join(lines))


def _cell_dir(overrides, naming=None) -> str:
    """``${cell_dir:${hydra.overrides.task},${hydra.job.config.override_dirname}}`` (configs/train.yaml), or the
    older one-argument form ``${cell_dir:${hydra.job.override_dirname}}`` that earlier cells' ``.hydra/hydra.yaml``
    holds."""
    if naming is None:
        return cell_dir_name(str(overrides))
    return cell_dir_name(cell_overrides(list(overrides), list(naming.get("exclude_keys") or []),
                                        str(naming.get("item_sep", ",")), str(naming.get("kv_sep", "="))))


def register_resolvers() -> None:
    """OmegaConf resolvers used by the configs, and the evaluation sections' defaults they compose from
    (``outlierlab.evaluation.settings_store.register_defaults``); idempotent.

    Also run when this module is imported: Hydra's joblib and submitit launchers resolve a cell's output
    directory (``${cell_dir:...}``) in their worker process, which imports this module while unpickling the
    task function but never runs ``train.py``'s module code.
    """
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
    from outlierlab.evaluation.settings_store import register_defaults  # light: no torch

    register_defaults()  # the sections' defaults (ConfigStore) that every preset of them starts from


def compose_config(config_name: str, overrides=()):
    """``configs/<config_name>.yaml`` composed with ``overrides`` from Python, as the command line would (the
    Python API, the per-checkpoint probes).

    Hydra keeps one global state and its ``initialize`` refuses to start while another is set, so a caller's own
    Hydra app or ``initialize`` context (a researcher's script that calls ``ol.evaluate``) is set aside while this
    composes and put back after -- not cleared for good, which would break that caller's next ``compose``.
    """
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


def check_device(device, key: str = "encoder.device") -> None:
    """A requested accelerator that this machine lacks is one line at start, not an assertion deep in torch when
    the model first moves (``Torch not compiled with CUDA enabled``). Imports torch: call it after the light checks."""
    name = str(device or "auto")
    if name in ("auto", "cpu", "meta"):
        return
    import torch

    kind, _, index = name.partition(":")
    if kind == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (index.isdigit() and int(index) >= n):
            have = "no CUDA GPU" if n == 0 else f"{n} CUDA GPU(s) (cuda:0..cuda:{n - 1})"
            raise ValueError(f"{key}={name} but this machine has {have}; use {key}=auto (a GPU when there is one) "
                             f"or {key}=cpu")
    elif kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"{key}={name} but MPS is not available here; use {key}=auto or {key}=cpu")


def _drop_lightning_tips(record: logging.LogRecord) -> bool:
    """False for Lightning's "💡 Tip:" advertisements (see ``one_console_for_lightning``)."""
    return not str(record.msg).startswith("💡 Tip:")


#: Rich's console width when the console is a log file (see :func:`one_console_for_lightning`).
LOG_COLUMNS = 120


def one_console_for_lightning() -> None:
    """Print each Lightning log line once.  ``import lightning`` gives the ``lightning`` logger a console handler of its
    own ("INFO: Seed set to 42") and lets its records propagate too; under Hydra, whose root handlers write the
    console and the run's log file, every Lightning line came out twice (Hydra issue #2898).  The jobs import
    Lightning only after Hydra has set up logging (a bad config fails before the slow imports), so a
    ``hydra.job_logging`` entry cannot reach that handler: the jobs call this when they start instead.
    Without handlers on the root logger (Lightning used outside Hydra) the handler stays.

    It also drops Lightning's product advertisements ("💡 Tip: ... try installing litlogger", "... litmodels"),
    logged at INFO at every Trainer start and not configurable in Lightning 2.6: a run's log says what the run
    did.  Every other Lightning line passes.

    And where the console is a file (``nohup``, Slurm, ``> train.log``) and ``COLUMNS`` is unset, Rich's console --
    the model summary's table and the progress bar -- gets ``LOG_COLUMNS`` columns instead of its
    fallback of 80, which cut the summary's module types to "Robert…" once FLOPs and in/out sizes joined it."""
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        import rich  # Lightning's dependency for its rich bar and summary

        if rich.get_console().width < LOG_COLUMNS:
            rich.reconfigure(width=LOG_COLUMNS)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _drop_lightning_tips not in rank_zero.filters:
        rank_zero.addFilter(_drop_lightning_tips)
    if not logging.getLogger().hasHandlers():
        return
    lightning_logger = logging.getLogger("lightning")
    for handler in list(lightning_logger.handlers):
        if type(handler) is logging.StreamHandler:  # Lightning's own console handler, not a file of the user's
            lightning_logger.removeHandler(handler)


register_resolvers()  # see its docstring: launcher workers need the resolvers too
