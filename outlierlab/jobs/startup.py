"""Start-up checks of the composed config for the Hydra entry points, importing nothing heavy.

``import lightning`` and ``import transformers`` take 10–15 s each on a small machine: a setting that cannot work
fails before them, in one line.  Also here: the run plan line and the device check.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import re
from pathlib import Path

from omegaconf import OmegaConf, open_dict

import outlierlab.configuration.composing  # noqa: F401 - registers the configs' resolvers (launcher workers)
from outlierlab.configuration.overrides import CONFIG_DIR
from outlierlab.configuration.typed_settings import as_int


def _target_error(target: str, where: str) -> str | None:
    """Whether a Hydra ``_target_`` exists, without importing it (attributes checked in our own files only)."""
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


def _duration(value) -> bool:
    """Whether Lightning's ``Timer`` reads ``value`` as ``DD:HH:MM:SS`` (a mapping reaches it unreadable)."""
    return isinstance(value, str) and re.fullmatch(r"\d+:\d\d:\d\d:\d\d", value.strip()) is not None


#: ``data.*`` keys that only the masked objective reads (refused with ``objective=clm``).
MASKED_ONLY_DATA_KEYS = ("mlm_probability", "mask_replace_prob", "random_replace_prob")


def _check_objective(cfg) -> None:
    """One line per masked-LM setting under ``objective=clm``, or objective keys edited apart."""
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
    """Validate a composed ``train.yaml`` before the heavy imports: what cannot work raises ``ValueError`` in one
    line (``trainer.max_steps`` < 1, a missing ``_target_``, ``data.block_size`` > ``model.max_len``, ...); what has a
    sensible reading is adjusted in ``cfg`` and returned as warnings (``val_check_interval`` above the run's length
    lowered to it, a warm-up >= max_steps, a clipped softmax that zeroes a uniform row)."""
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
    as_int(cfg.get("seed"), "seed")  # seed=abc failed after the data loaded, as int()'s "invalid literal"
    threads = cfg.get("threads")
    if threads is not None and as_int(threads, "threads") < 1:  # 0 read as null: all cores, unasked
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
    max_steps = as_int(trainer.max_steps, "trainer.max_steps")
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
        warmup = as_int(sched.num_warmup_steps, "module.scheduler.num_warmup_steps")
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
    if every is not None and as_int(every, "callbacks.model_checkpoint.every_n_train_steps") < 1:
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

    ``clip((ζ-γ)·p + γ, 0, 1)`` is 0, with zero gradient, for every ``p < -γ/(ζ-γ)``; attention starts near uniform
    (``p ≈ 1/T``), so if ``-γ/(ζ-γ) >= 1/T`` queries and keys get no gradient and attention may never switch on (the
    emergence_cpu model at Bondarenko et al.'s BERT α, γ = -0.05: zero attention mass throughout, docs/emergence.md).
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
    """One line: steps, devices, global batch, tokens and precision (Luo et al. Table 4: batch 256)."""
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


def check_device(device, key: str = "encoder.device") -> None:
    """A requested accelerator this machine lacks, in one line at start; imports torch."""
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

