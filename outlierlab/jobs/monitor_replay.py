"""The live monitors replayed on saved checkpoints (settings, rows, tokenizer, staged output), shared by
``outlierlab.jobs.posthoc`` and ``outlierlab.jobs.posthoc_trainer``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outlierlab.jobs.checkpoint_io import replace_dir
from outlierlab.utils.dir_lock import pid_alive

#: Defaults of the monitors (configs/callbacks/monitors.yaml); a run's config.yaml overrides them.
# rule: the ln_rule a run recorded (callbacks.layernorm_monitor.rule); None: LayerNormRule's defaults
LAYERNORM_DEFAULTS = {"rule": None, "top_k": 3, "vectors": True}
HIDDEN_DEFAULTS = {"n_sequences": 32, "sentences_path": None, "max_length": None, "top_k": 5, "n_pairs": 1000,
                   "seed": 0, "vectors": True, "sink_threshold": 0.3, "w8a8": True}
OUT_SUBDIR = "monitor_posthoc"


def apply_overrides(ln_cfg: dict, hs_cfg: dict, overrides: dict) -> tuple[dict, dict]:
    """The monitor settings with ``overrides`` (``ln_top_k`` is the LayerNorm ``top_k``); unknown keys raise."""
    unknown = set(overrides) - set(ln_cfg) - set(hs_cfg) - {"ln_top_k"}
    if unknown:
        raise ValueError(f"unknown analyze_run setting(s) {sorted(unknown)}; valid: "
                         f"{sorted(set(ln_cfg) | set(hs_cfg) | {'ln_top_k'})}")
    for key, value in overrides.items():
        if key == "ln_top_k":
            ln_cfg["top_k"] = value
        elif key == "top_k":
            hs_cfg["top_k"] = value
        else:
            for cfg in (ln_cfg, hs_cfg):
                if key in cfg:
                    cfg[key] = value
    return ln_cfg, hs_cfg


def tokenizer_from(tokenizer: Any, dirs: Sequence[Path], missing: str):
    """``tokenizer`` as an object, else from it or the first of ``dirs`` holding one; else ``missing``."""
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    from transformers import AutoTokenizer

    tok_dir = Path(tokenizer) if tokenizer is not None else next(
        (d for d in dirs if (d / "tokenizer_config.json").is_file() or (d / "tokenizer.json").is_file()), None)
    if tok_dir is None:
        raise FileNotFoundError(missing)
    return AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)


def hidden_rows(step: int, model, batch: dict, hs_cfg: dict, device: str, mask_id: int | None = None
                ) -> tuple[list, Any]:
    """The hidden-state monitor's rows of one checkpoint and that forward's attention probabilities."""
    import torch

    from outlierlab.metrics.monitor_records import hidden_state_records
    from outlierlab.models.sites import monitored_forward

    config = model.config
    with torch.inference_mode():
        hidden, attn, inf = monitored_forward(model, batch["input_ids"].to(device), batch["attention_mask"].to(device))
        rows = hidden_state_records(step, hidden, batch["attention_mask"], batch["special_tokens_mask"],
                                    top_k=hs_cfg["top_k"], n_pairs=hs_cfg["n_pairs"], seed=hs_cfg["seed"],
                                    vectors=hs_cfg["vectors"], attentions=attn, input_ids=batch["input_ids"],
                                    bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                    inf_norms=inf, sink_threshold=hs_cfg["sink_threshold"])[0]
        if hs_cfg.get("w8a8"):
            from outlierlab.models.w8a8 import w8a8_cost
            from outlierlab.monitoring.hidden_state_tracker import is_causal_lm

            cost = w8a8_cost(model, batch, is_causal_lm(model), mask_id)
            rows += [(step, "model", f"w8a8_{k}", None, float(v)) for k, v in cost.items()]
    return rows, attn


class StagedHistories:
    """Staged post-hoc outputs that ``commit`` puts in place of ``out`` whole: a kill never leaves a mix."""

    NAMES = ("layernorm", "hidden_states")

    def __init__(self, out: Path) -> None:
        from outlierlab.monitoring.history import HistoryCSV

        self.out = Path(out)
        self.dir = self.out.with_name(f".{self.out.name}.partial-{os.getpid()}")
        for stale in self.out.parent.glob(f".{self.out.name}.partial-*"):  # a killed analysis' generation
            pid = stale.name.rsplit("-", 1)[-1]
            if stale != self.dir and not (pid.isdigit() and pid_alive(int(pid))):
                shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.files = {name: HistoryCSV(self.dir / f"{name}.csv") for name in self.NAMES}

    def __getitem__(self, name: str):
        return self.files[name]

    def commit(self) -> dict[str, Path]:
        """Put the staging folder in place of ``out``; ``{name: final path}`` of the two histories."""
        for h in self.files.values():  # a history with no record still says what it would hold
            if not h.path.exists():
                h.append([])
        replace_dir(self.dir, self.out)
        return {name: self.out / f"{name}.csv" for name in self.NAMES}


def layernorm_kwargs(ln_cfg: dict) -> dict[str, Any]:
    """``outlierlab.metrics.monitor_records.layernorm_records``' settings from the monitor's LayerNorm config."""
    return dict(rule=ln_cfg["rule"], top_k=ln_cfg["top_k"], vectors=ln_cfg["vectors"])
