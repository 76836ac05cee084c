"""The model card (``README.md``) of a run's export, generated from the run directory.

The card keeps the weights with how they were made (Mitchell et al. 2019, "Model Cards for Model Reporting"):
architecture, objective, recipe, data and tokens seen (``config.yaml``), steps (``finished.json``, else
``trained_steps.json``), the last validation loss and order use (``csv/metrics.csv``), the outlier statistics at the
last monitored step (``monitor/``), the command (``.hydra/overrides.yaml``) and the code version
(``code_versions.jsonl``).  Every number is read from the run's files, never re-measured; a missing file leaves its
section saying so.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from outlierlab.jobs.run_state import changes_text, code_versions, finished_run, read_json, read_yaml
from outlierlab.monitoring.history import history_frame, read_history
from outlierlab.utils.atomic import write_atomic
from outlierlab.utils.tables import model_step, read_rows

CARD = "README.md"
#: The validation metrics the card reports, in order (the run logs them in csv/metrics.csv).
VAL_METRICS = ("val/loss", "val/ppl", "val/acc", "val/order_use")


def _float(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def last_logged(rows: list[dict[str, str]], column: str) -> tuple[int, float] | None:
    """(step, value) of the last ``metrics.csv`` row where ``column`` holds a number (the model's step)."""
    for row in reversed(rows):
        v = _float(row.get(column))
        if v is not None:
            return model_step(row), v
    return None


def hidden_state_summary(path: Path) -> dict[str, Any] | None:
    """The loop monitor's per-layer ``argmax_share``, ``kurtosis`` and ``max_median`` at its last step, read as the
    monitors read their histories (a row torn by a kill mid-write is skipped, not read as a shorter number)."""
    stats = ("argmax_share", "kurtosis", "max_median")
    rows = [r for r in read_history(path, stats) if math.isfinite(r["value"])] if Path(path).is_file() else []
    if not rows:
        return None
    step = max(r["step"] for r in rows)
    layers: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["step"] == step:
            entry = layers.setdefault(r["name"], {})
            entry[r["statistic"]] = r["value"]
            if r["statistic"] == "argmax_share":
                entry["argmax_dim"] = r["dim"]
    _add_dim_identity(path, layers)
    out: dict[str, Any] = {"step": step, "layers": layers}
    for stat in stats:
        have = {name: e[stat] for name, e in layers.items() if stat in e}
        if have:
            name = max(have, key=lambda n: (have[n], n))
            out[f"max_{stat}"] = {"value": have[name], "layer": name, **({"dim": layers[name].get("argmax_dim")}
                                                                          if stat == "argmax_share" else {})}
    return out


def _add_dim_identity(path: Path, layers: dict[str, dict[str, Any]]) -> None:
    """Per layer: its |x| argmax dim at the last record, its share, and since when (Kovaleva et al. 2021)."""
    from outlierlab.metrics.layer_identity import layer_identity

    for r in layer_identity(history_frame(path)).itertuples():
        if f"layer_{r.layer}" in layers:
            layers[f"layer_{r.layer}"].update(abs_argmax_dim=int(r.dim), abs_argmax_share=float(r.share),
                                              held_since=int(r.held_since))


def layernorm_summary(path: Path) -> dict[str, Any] | None:
    """The LayerNorm rule's ``n_outlier_dims`` at the monitor's last step (Kovaleva et al. 2021)."""
    rows = [r for r in read_history(path) if r["name"] == "model"] if Path(path).is_file() else []
    if not rows:
        return None
    step = max(r["step"] for r in rows)
    vals = {r["statistic"]: _float(r["value"]) for r in rows if r["step"] == step}
    out: dict[str, Any] = {"step": step}
    for key in ("n_outlier_dims", "min_layers"):
        if vals.get(key) is not None:
            out[key] = int(vals[key])
    return out


def _export_kind(export_dir: Path) -> str:
    cfg = read_json(export_dir / "config.json") or {}
    if cfg.get("model_type") == "roberta":
        return "hf"
    if "auto_map" in cfg:
        return "remote_code"
    return "outlierlab"


def _model_config(run: Path, export: Path | None, config: dict) -> dict:
    """The model's EncoderConfig as trained: the export's config (vocabulary filled in) before config.yaml's."""
    if export is not None:
        ours = read_json(export / "outlierlab_config.json")
        if isinstance(ours, dict):
            return ours
    for hp in (run / "csv" / "hparams.yaml", run / "tensorboard" / "hparams.yaml"):
        node = read_yaml(hp)
        if isinstance(node, dict) and isinstance(node.get("model"), dict):
            return node["model"]
    model = dict(config.get("model") or {})
    hf = read_json(export / "config.json") if export is not None else None
    if isinstance(hf, dict) and "vocab_size" in hf:  # a native RoBERTa export knows the real vocabulary
        model["vocab_size"] = hf["vocab_size"]
    return model


#: The step an export holds, for the card of a run stopped early (no ``finished.json``).
TRAINED_STEPS = "trained_steps.json"


def record_trained_steps(export_dir: str | Path, global_step: int) -> None:
    write_atomic(Path(export_dir) / TRAINED_STEPS, json.dumps({"global_step": int(global_step)}))


def trained_steps(export_dir: str | Path) -> int | None:
    """The step ``export_dir`` holds (``TRAINED_STEPS``), or None where the export does not record it."""
    step = (read_json(Path(export_dir) / TRAINED_STEPS) or {}).get("global_step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def card_data(run_dir: str | Path, export_dir: str | Path | None = None, global_step: int | None = None) -> dict:
    """Everything the card states, read from ``run_dir`` (see the module docstring); JSON-able."""
    run = Path(run_dir)
    export = Path(export_dir) if export_dir is not None else None
    manifest = read_json(run / "manifest.json") or {}
    config = read_yaml(run / "config.yaml") or manifest.get("config") or {}
    finished = finished_run(run)
    if finished is not None:
        global_step = int(finished["global_step"])
    elif global_step is None and export is not None:  # an export of a run stopped early, its card rewritten later
        global_step = trained_steps(export)
    metrics_rows = read_rows(run / "csv" / "metrics.csv")
    hits = {key: last_logged(metrics_rows, key) for key in VAL_METRICS}
    val = {key: {"step": hit[0], "value": hit[1]} for key, hit in hits.items() if hit is not None}
    lengths = last_logged(metrics_rows, "train/lengths")
    data_cfg, trainer_cfg = config.get("data") or {}, config.get("trainer") or {}
    seqs_per_step = tokens = None
    if data_cfg.get("batch_size") and str(trainer_cfg.get("devices", 1)).isdigit():
        world = int(trainer_cfg.get("devices") or 1) * int(trainer_cfg.get("num_nodes") or 1)
        seqs_per_step = int(data_cfg["batch_size"]) * int(trainer_cfg.get("accumulate_grad_batches") or 1) * world
        if global_step is not None and data_cfg.get("block_size"):
            tokens = int(global_step) * seqs_per_step * int(data_cfg["block_size"])
    overrides = read_yaml(run / ".hydra" / "overrides.yaml")
    if not isinstance(overrides, list):
        overrides = manifest.get("overrides")
    return {
        "run_dir": str(run),
        "export": None if export is None else {"kind": _export_kind(export)},
        "model": _model_config(run, export, config),
        "objective": config.get("objective") or (config.get("data") or {}).get("objective") or "mlm",
        "seed": config.get("seed"),
        # top-level since the optimizer became a config group; a run saved before keeps it under module
        "optimizer": config.get("optimizer") or (config.get("module") or {}).get("optimizer") or {},
        "scheduler": (config.get("module") or {}).get("scheduler") or {},
        "data": data_cfg,
        "tokenizer": config.get("tokenizer") or {},
        "trainer": {k: trainer_cfg.get(k) for k in ("max_steps", "accumulate_grad_batches", "devices", "num_nodes",
                                                   "precision", "gradient_clip_val") if k in trainer_cfg},
        "global_step": global_step,
        "finished": finished is not None,
        "sequences_per_step": seqs_per_step,
        "tokens_seen": tokens,
        "throughput_lengths": None if lengths is None else {"step": lengths[0], "value": lengths[1]},
        "val": val,
        "hidden_states": hidden_state_summary(run / "monitor" / "hidden_states.csv"),
        "layernorm": layernorm_summary(run / "monitor" / "layernorm.csv"),
        "overrides": [str(o) for o in overrides] if isinstance(overrides, list) else None,
        "code_versions": code_versions(run),
    }


def _g(v: Any, digits: int = 6) -> str:
    """A number as the card prints it: ``digits`` significant digits (tests format the CSV values the same way)."""
    if v is None:
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.{digits}g}"


def _target(node: dict) -> str:
    return str(node.get("_target_", "?")).rsplit(".", 1)[-1]


def _architecture(model: dict, objective: str) -> list[str]:
    pos = model.get("pos") or {}
    pos_opts = ", ".join(f"{k}={v}" for k, v in pos.items() if k != "name")
    switches = [f"{k}={model.get(k)}" for k, default in (("norm_placement", "post"), ("norm", "layernorm"),
                                                          ("attention", "softmax"), ("block", "roberta"))
                if model.get(k, default) != default]
    kind = "decoder (causal attention, next-token prediction)" if objective == "clm" else \
        "encoder (bidirectional attention, masked-token prediction)"
    return [
        f"* **Model:** RoBERTa-style {kind} (Liu et al. 2019), outlierlab's own implementation",
        f"* **Size:** {model.get('num_layers')} layers, hidden {model.get('hidden_size')}, {model.get('num_heads')} "
        f"heads, FFN {model.get('intermediate_size')}, vocabulary {model.get('vocab_size')}, up to "
        f"{model.get('max_len')} tokens",
        f"* **Position scheme:** `{pos.get('name', '?')}`" + (f" ({pos_opts})" if pos_opts else ""),
        "* **Architecture switches:** " + (", ".join(f"`model.{s}`" for s in switches) if switches
                                           else "none (post-LN RoBERTa, affine LayerNorm, softmax attention)"),
    ]


def _how_to_load(kind: str | None, objective: str) -> list[str]:
    auto = "AutoModelForCausalLM" if objective == "clm" else "AutoModelForMaskedLM"
    if kind == "hf":
        line = f'model = {auto}.from_pretrained("<this directory or repo id>")'
        note = "A plain RoBERTa: transformers' own classes load it."
    elif kind == "remote_code":
        line = f'model = {auto}.from_pretrained("<this directory or repo id>", trust_remote_code=True)'
        note = ("transformers has no class for this architecture, so the directory carries its code "
                "(`modeling_outlierlab.py`, generated from outlierlab's model sources at export; it imports only "
                "torch and transformers): read it before trusting it.")
    else:
        return ["Load it with `outlierlab.models.load_pretrained(<this directory>)` (no Hugging Face config)."]
    return [note, "", "```python", f"from transformers import AutoTokenizer, {auto}", "",
            # a remote-code directory: answering for the tokenizer keeps transformers from asking (it needs no code)
            'tokenizer = AutoTokenizer.from_pretrained("<this directory or repo id>"'
            + (", trust_remote_code=False)" if kind == "remote_code" else ")"),
            line, "```",
            "", "outlierlab reads it too: `outlierlab.models.load_pretrained(<directory>)`, or "
            "`encoder.name_or_path=<directory>` in probe.py / evaluate.py."]


def _stopped_early(step: Any, max_steps: Any) -> bool:
    try:
        return int(max_steps) > 0 and int(step) < int(max_steps)
    except (TypeError, ValueError):
        return False


def render_card(d: dict) -> str:
    """The Markdown of the card (with the Hub's YAML metadata block) from ``card_data``."""
    model, objective = d["model"], d["objective"]
    kind = (d.get("export") or {}).get("kind")
    tags = ["outlierlab", "roberta", f"positions-{(model.get('pos') or {}).get('name', 'unknown')}", objective]
    if kind == "remote_code":
        tags.append("custom_code")  # the Hub's tag for models that need trust_remote_code
    front = ["---", "library_name: transformers",
             f"pipeline_tag: {'text-generation' if objective == 'clm' else 'fill-mask'}",
             "tags:", *[f"- {t}" for t in tags], "---", ""]
    pos_name = (model.get("pos") or {}).get("name", "?")
    out = [*front, f"# outlierlab run: `{pos_name}` positions, {objective.upper()}", "",
           "Trained with outlierlab's `train.py`; this card was generated from the run directory "
           "(`outlierlab.jobs.model_card`). Numbers are the run's own logs, not re-measured.", "",
           "## How to load", "", *_how_to_load(kind, objective), "",
           "## Architecture", "", *_architecture(model, objective), ""]
    out += [*_recipe(d), *_data(d), *_validation(d), *_outlier_features(d), *_reproduce(d)]
    return "\n".join(out) + "\n"


def _recipe(d: dict) -> list[str]:
    """The card's Recipe section: objective, optimizer, schedule, batch, steps, precision."""
    objective, opt, sch, data, tr = d["objective"], d["optimizer"], d["scheduler"], d["data"], d["trainer"]
    return ["## Recipe", "",
            f"* **Objective:** `{objective}`" + (f", masking {data.get('mlm_probability')}"
                                                  if objective != "clm" and data.get("mlm_probability") else ""),
            f"* **Optimizer:** {_target(opt) if opt else '–'}" + "".join(
                f", {k.replace('_', ' ')} {_g(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v}"
                for k, v in opt.items() if not str(k).startswith("_")),
            f"* **Schedule:** {_target(sch) if sch else '–'}, warmup {sch.get('num_warmup_steps', '–')} steps, "
            f"{sch.get('num_training_steps', '–')} training steps",
            f"* **Batch:** {data.get('batch_size', '–')} sequences per device x "
            f"{tr.get('accumulate_grad_batches', 1)} accumulation x {tr.get('devices', 1)} device(s) x "
            f"{tr.get('num_nodes', 1)} node(s) = {_g(d['sequences_per_step'])} sequences per step; "
            f"block size {data.get('block_size', '–')} tokens",
            f"* **Steps:** {_g(d['global_step'])} of max_steps {tr.get('max_steps', '–')}"
            + (" (stopped early)" if _stopped_early(d["global_step"], tr.get("max_steps")) else ""),
            f"* **Precision:** {tr.get('precision', '–')}, gradient clipping {tr.get('gradient_clip_val', '–')}, "
            f"seed {d.get('seed')}", ""]


def _data(d: dict) -> list[str]:
    """The card's Data section: corpus, tokenizer, tokens seen."""
    model, data = d["model"], d["data"]
    src = data.get("hub") or data.get("source") or "–"
    tl = d.get("throughput_lengths")
    return ["## Data", "",
            f"* **Corpus:** `{src}`" + (f", first {data['max_documents']} documents" if data.get("max_documents")
                                        else ""),
            f"* **Tokenizer:** {d['tokenizer'].get('name_or_path') or 'trained on the corpus (BPE)'}, vocabulary "
            f"{model.get('vocab_size', d['tokenizer'].get('vocab_size'))}",
            f"* **Tokens seen:** {_g(d['tokens_seen'], 12)} (steps x sequences per step x block size; packed blocks)"
            + (f"; Lightning's ThroughputMonitor counted {_g(tl['value'], 12)} on one device (logged step {tl['step']})"
               if tl else ""), ""]


def _validation(d: dict) -> list[str]:
    """The card's Validation section: the last logged value of every ``val/`` metric."""
    out = ["## Validation", ""]
    if d["val"]:
        out += ["| metric | value | step |", "|---|---|---|"]
        out += [f"| `{k}` | {_g(v['value'])} | {v['step']} |" for k, v in d["val"].items()]
        if "val/order_use" in d["val"]:
            out += ["", "`val/order_use`: the loss increase in nats when each block's tokens are permuted; near 0 the "
                    "model does not use token order (docs/order_use.md)."]
    else:
        out += ["No validation metrics were logged (csv/metrics.csv absent or without `val/` columns)."]
    return out


def _outlier_features(d: dict) -> list[str]:
    """The card's outlier section: hidden-state and LayerNorm-rule statistics of the last monitored step."""
    out = ["", "## Outlier features at the last monitored step", ""]
    hs, ln = d["hidden_states"], d["layernorm"]
    if hs:
        m = hs.get("max_argmax_share") or {}
        k = hs.get("max_kurtosis") or {}
        mm = hs.get("max_max_median") or {}
        out += [f"From `monitor/hidden_states.csv`, step {hs['step']} (docs/outlier_metrics.md):", "",
                f"* **Largest argmax share:** {_g(m.get('value'))} ({m.get('layer')}, dim {m.get('dim')}): the share "
                "of tokens whose largest component is that layer's most common dim (Luo et al. 2021)",
                f"* **Largest activation kurtosis:** {_g(k.get('value'))} ({k.get('layer')}); 1 = every dim the same "
                "RMS (He et al. 2024)",
                f"* **Largest max/median:** {_g(mm.get('value'))} ({mm.get('layer')})", "",
                "| layer | argmax share | argmax dim | \\|x\\| argmax dim (share) | held since step | kurtosis | "
                "max/median |", "|---|---|---|---|---|---|---|"]
        for name, e in hs["layers"].items():
            ident = (f"{e['abs_argmax_dim']} ({_g(e['abs_argmax_share'])})", e["held_since"]) \
                if "abs_argmax_dim" in e else ("–", "–")
            out.append(f"| {name} | {_g(e.get('argmax_share'))} | {e.get('argmax_dim', '–')} | {ident[0]} | "
                       f"{ident[1]} | {_g(e.get('kurtosis'))} | {_g(e.get('max_median'))} |")
        out += ["", "held since: the first monitored step from which the layer's |x| argmax dimension stayed the "
                "same (`python -m outlierlab.studies.dim_identity`)."]
    else:
        out.append("No hidden-state monitor output (`monitor/hidden_states.csv`).")
    if ln and "n_outlier_dims" in ln:
        out += ["", f"* **LayerNorm-rule outlier dims** (`monitor/layernorm.csv`, step {ln['step']}): "
                f"{ln['n_outlier_dims']} (gain and bias outside 3σ in at least {ln.get('min_layers', '?')} "
                "LayerNorm(s); Kovaleva et al. 2021)"]
    elif hs:
        out += ["", "No LayerNorm-rule count (`monitor/layernorm.csv` absent, or a model without affine LayerNorms)."]
    return out


def _reproduce(d: dict) -> list[str]:
    """The card's Reproduce section: the command and every code version the run started on."""
    out = ["", "## Reproduce", ""]
    if d["overrides"] is not None:
        out += ["```bash", " ".join(["python train.py", *(shlex.quote(o) for o in d["overrides"])]), "```"]
    else:
        out += ["The run's overrides were not found (`.hydra/overrides.yaml`)."]
    out += ["", "Code version (one line per start or resume of the run, `code_versions.jsonl`):", ""]
    if d["code_versions"]:
        out += [f"* {v.get('started', '?')}: from step {v.get('global_step_at_start', '?')}, commit "
                f"`{v.get('commit')}`" + (" (uncommitted changes)" if v.get("dirty") else "") + _changed(v)
                for v in d["code_versions"]]
    else:
        out += ["* not recorded"]
    return out


def _changed(start: dict) -> str:
    """What a resume changed, as the card states it: the command above gives only the last start's overrides."""
    text = changes_text(start, markdown=True)
    return f"; settings changed at this resume: {text}" if text else ""


def write_model_card(run_dir: str | Path, export_dir: str | Path, global_step: int | None = None) -> Path:
    """Write ``<export_dir>/README.md`` from ``run_dir``; ``global_step``: before ``finished.json`` exists."""
    d = card_data(run_dir, export_dir, global_step)
    path = Path(export_dir) / CARD
    write_atomic(path, render_card(d))
    return path
