"""Post-hoc monitor histories of a Hugging Face ``Trainer`` run: every ``<output_dir>/checkpoint-<step>``.

The counterpart of ``outlierlab.jobs.posthoc.analyze_run`` for Trainer runs (e.g. monitored by
``OutlierMonitorCallback``), with the same settings, held-out batch and functions, so a step's live rows are
reproduced.  A PEFT run's adapter checkpoints are rebuilt as base model plus merged adapter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outlierlab.datamodules.eval_data import load_sentences
from outlierlab.jobs.monitor_replay import (HIDDEN_DEFAULTS, LAYERNORM_DEFAULTS, OUT_SUBDIR, StagedHistories,
                                           apply_overrides, hidden_rows, layernorm_kwargs, tokenizer_from)
from outlierlab.utils.tables import write_csv

__all__ = ["HF_CHECKPOINT_PREFIX", "find_hf_checkpoints", "analyze_hf_checkpoints"]


#: Hugging Face Trainer checkpoint folders: ``<output_dir>/checkpoint-<global_step>``.
HF_CHECKPOINT_PREFIX = "checkpoint-"


#: What a PEFT (LoRA, ...) Trainer run saves in each checkpoint instead of the model: the adapter and its base's name.
ADAPTER_CONFIG = "adapter_config.json"


def find_hf_checkpoints(output_dir: str | os.PathLike) -> dict[int, Path]:
    """``{global_step: checkpoint dir}`` of a Trainer run holding a model or a PEFT adapter."""
    out = Path(output_dir)
    found = {}
    for d in out.glob(f"{HF_CHECKPOINT_PREFIX}*"):
        suffix = d.name[len(HF_CHECKPOINT_PREFIX):]
        if d.is_dir() and suffix.isdigit() and ((d / "config.json").is_file() or (d / ADAPTER_CONFIG).is_file()):
            found[int(suffix)] = d
    return dict(sorted(found.items()))


def load_checkpoint(path: Path):
    """``(model, headless)``: a checkpoint's model with its LM head, or base model with the adapter merged."""
    from outlierlab.models.encoder_source import EncoderSource
    from outlierlab.models.placement import load_hf_model

    adapter = (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()
    base = str(path)
    if adapter:
        base = json.loads((path / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or ""
        if not base:
            raise ValueError(f"{path / ADAPTER_CONFIG} names no base_model_name_or_path: cannot rebuild the model")
        if (os.path.isabs(base) or base.startswith(".")) and not Path(base).is_dir():
            raise FileNotFoundError(f"{path}: the adapter's base model {base} is not there (moved or deleted?); put it "
                                    f"back, or set base_model_name_or_path in {ADAPTER_CONFIG}")
    loaded = load_hf_model(EncoderSource("hf", base, base, base), lm_head=True)
    model = loaded.body if loaded.lm is None else loaded.lm
    if adapter:
        try:
            from peft import PeftModel
        except ImportError:
            raise ImportError(f"{path} holds a PEFT adapter: pip install peft to analyse it") from None
        model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    return model, loaded.lm is None


def analyze_hf_checkpoints(output_dir: str | os.PathLike, texts: Sequence[str] | None = None, tokenizer: Any = None,
                           out_dir: str | os.PathLike | None = None, monitor_dir: str | os.PathLike | None = None,
                           device: str = "cpu", **overrides: Any) -> dict[str, Any]:
    """Post-hoc monitor histories for every ``checkpoint-<step>`` of a Hugging Face ``Trainer`` run
    (``output_dir``): each checkpoint with its LM head (a headless one: its body) through the live monitors' functions,
    ``layernorm_records`` (Kovaleva et al. 2021; Puccetti et al. 2022) and ``hidden_state_records`` (Luo et al.
    2021), on the same held-out batch, so its rows reproduce the live rows of its step.  Divergence from init reads
    ``<monitor_dir>/layernorm_initial.pt`` (default ``<output_dir>/monitor``; also step 0's rows), else the standard
    init.  Other arguments as ``analyze_run``; ``out_dir`` default ``<output_dir>/monitor_posthoc``.  Returns the CSV
    paths (``layernorm``, ``hidden_states``, ``order_use``) and the analysed ``steps``."""
    run = Path(output_dir)
    ckpts = find_hf_checkpoints(run)
    if not ckpts:
        raise FileNotFoundError(f"{run} holds no {HF_CHECKPOINT_PREFIX}<step>/ folder with a config.json or an "
                                f"{ADAPTER_CONFIG}: pass the output_dir of a transformers Trainer run saved with "
                                "save_steps")
    # the loop monitors' defaults: W8A8 off unless asked (w8a8=True), as HiddenStateTracker's, so the post-hoc rows
    # are the live ones
    ln_cfg, hs_cfg = apply_overrides(dict(LAYERNORM_DEFAULTS), {**HIDDEN_DEFAULTS, "w8a8": False}, overrides)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported (it reads the flag at import)
    from outlierlab.metrics.monitor_records import layernorm_records, layernorm_snapshot, tokenize_heldout
    from outlierlab.models.layernorms import model_layernorms
    from outlierlab.metrics.word_order import heldout_order_use, heldout_special_ids
    from outlierlab.monitoring.hidden_state_tracker import (heldout_max_length, is_causal_lm, order_use_records,
                                                            vector_order_records)
    from outlierlab.monitoring.loop_monitor import INITIAL_SNAPSHOT

    if texts is None:
        texts = load_sentences(hs_cfg["sentences_path"])[: int(hs_cfg["n_sequences"])]
    initial = _monitor_snapshot(Path(monitor_dir if monitor_dir is not None else run / "monitor") / INITIAL_SNAPSHOT)
    out = Path(out_dir) if out_dir is not None else run / OUT_SUBDIR
    files, ln_kw = StagedHistories(out), layernorm_kwargs(ln_cfg)
    if initial is not None and 0 not in ckpts:
        files["layernorm"].append(layernorm_records(0, initial, initial, **ln_kw)[0])
    order_rows: list[dict] = []
    for step, path in ckpts.items():
        model, headless = load_checkpoint(path)  # headless: a body saved without its head, no loss of its own
        model = model.to(device).eval()
        tok = tokenizer_from(tokenizer, [path, run], f"{path} holds no tokenizer (give the Trainer "
                             "processing_class=tokenizer, or pass tokenizer=...)")
        params = layernorm_snapshot(model_layernorms(model))
        files["layernorm"].append(layernorm_records(step, params, initial, **ln_kw)[0])
        batch = tokenize_heldout(tok, texts, heldout_max_length(model, tok, hs_cfg["max_length"]))
        rows, attn = hidden_rows(step, model, batch, hs_cfg, device, getattr(tok, "mask_token_id", None))
        special = heldout_special_ids(model.config, tok)
        if headless:  # the live monitor's rows for such a model: its vectors' order change, no order use in nats
            order = vector_order_records(step, model, batch, special, is_causal_lm(model), attn, hs_cfg["seed"])
            files["hidden_states"].append(rows + order[0])
            continue
        value, local = heldout_order_use(model, batch, is_causal_lm(model), special,
                                         getattr(tok, "mask_token_id", None), attn)
        files["hidden_states"].append(rows + order_use_records(step, value, local))  # the live monitor's rows
        order_rows.append({"step": step, **value})
    result: dict[str, Any] = {"steps": list(ckpts)}
    write_csv(files.dir / "order_use.csv", order_rows, ["step", "loss", "loss_permuted", "order_use", "tokens"])
    result["order_use"] = out / "order_use.csv"
    return {**result, **files.commit()}


def _monitor_snapshot(snapshot: Path) -> dict | None:
    """The live monitor's LayerNorm (gain, bias) at initialisation, float32, if it wrote one."""
    if not snapshot.is_file():
        return None
    import torch

    from outlierlab.monitoring.layernorm_tracker import initial_from_state

    return initial_from_state(torch.load(snapshot, map_location="cpu", weights_only=True))
