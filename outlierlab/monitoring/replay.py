"""The live monitors replayed on a finished run's checkpoints: the same trackers, the same rows, after the fact.

For every checkpoint, ``LayerNormTracker`` and ``HiddenStateTracker`` -- the objects every live monitor drives -- record
the model on the shipped held-out sentences, so a step's post-hoc rows are the live rows of that step: LayerNorm 3σ
outliers and divergence from init (Kovaleva et al. 2021, Puccetti et al. 2022), the hidden-state statistics of
``monitor_records`` (Luo et al. 2021 and the later measures listed there), order use and attention locality (the loop
monitors' rows; a model without an LM head: its vectors' order change) and, where the run's monitor had it, the W8A8
cost.  Two kinds of run:

* ``analyze_run``: a ``train.py`` run, ``<run>/checkpoints/*.ckpt`` (``last.ckpt`` skipped where a step checkpoint
  holds its step); settings default to the run's monitors' (``<run>/config.yaml``); divergence from init reads the
  initial LayerNorm snapshot every checkpoint stores.  Also ``metrics.csv`` (a row per step and layer,
  ``METRIC_COLUMNS``: the rogue dims' share, Timkey & van Schijndel 2021; IsoScore, Rudman et al. 2022; the LayerNorm
  rule's outlier count) and ``metrics.png``.
* ``analyze_hf_checkpoints``: a transformers ``Trainer`` run, every ``checkpoint-<step>/`` (a PEFT adapter: its base
  model with the adapter merged); the loop monitors' defaults; divergence from ``<monitor_dir>/layernorm_initial.pt``.

Both write ``layernorm.csv``, ``hidden_states.csv`` and ``order_use.csv`` (a row per checkpoint with an LM head) into
``<run>/monitor_posthoc/``, staged and put in place whole.  Without the initial snapshot, divergence is measured from
the standard init (gain 1, bias 0).  ``python -m outlierlab.jobs.posthoc`` is the command line of both.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

from outlierlab.monitoring.history import HistoryCSV, wide_by_layer
from outlierlab.utils.atomic import replace_dir
from outlierlab.utils.dir_lock import pid_alive
from outlierlab.utils.tables import write_csv

__all__ = ["analyze_run", "analyze_hf_checkpoints", "find_checkpoints", "find_hf_checkpoints", "monitor_settings",
           "METRIC_COLUMNS", "OUT_SUBDIR"]

#: Defaults of the monitors (configs/callbacks/monitors.yaml); a run's config.yaml overrides them.
# rule: the ln_rule a run recorded (callbacks.layernorm_monitor.rule); None: LayerNormRule's defaults
LAYERNORM_DEFAULTS = {"rule": None, "top_k": 3, "vectors": True}
HIDDEN_DEFAULTS = {"n_sequences": 32, "sentences_path": None, "max_length": None, "top_k": 5, "n_pairs": 1000,
                   "seed": 0, "vectors": True, "sink_threshold": 0.3, "w8a8": True}
OUT_SUBDIR = "monitor_posthoc"

#: Per-layer columns of ``metrics.csv`` (after ``step, layer``); ``*_dim`` columns follow their share.
METRIC_COLUMNS = ("kurtosis", "max_median", "max_abs", "inf_norm_ffn_output", "inf_norm_ln_input",
                  "inf_norm_ln_output", "argmax_share", "argmin_share", "abs_argmax_share", "sink_share_bos",
                  "sink_share_eos", "attn_entropy", "attn_row_mass", "anisotropy", "rogue_top1_share",
                  "rogue_top3_share", "isoscore", "n_layernorm_outliers", "attn_local", "order_use")
_WITH_DIMS = ("max_abs", "argmax_share", "argmin_share", "abs_argmax_share", "rogue_top1_share")
_ORDER_USE_FIELDS = ["step", "loss", "loss_permuted", "order_use", "tokens"]

#: Hugging Face Trainer checkpoint folders: ``<output_dir>/checkpoint-<global_step>``.
HF_CHECKPOINT_PREFIX = "checkpoint-"
#: What a PEFT (LoRA, ...) Trainer run saves in each checkpoint instead of the model: the adapter and its base's name.
ADAPTER_CONFIG = "adapter_config.json"


# -- settings --------------------------------------------------------------------------------------------------------
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


def monitor_settings(run_dir: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """(LayerNorm, hidden-state) monitor settings of a run: defaults updated from ``<run>/config.yaml``."""
    ln, hs = dict(LAYERNORM_DEFAULTS), dict(HIDDEN_DEFAULTS)
    cfg_file = Path(run_dir) / "config.yaml"
    if cfg_file.is_file():
        callbacks = OmegaConf.to_container(OmegaConf.load(cfg_file)).get("callbacks") or {}
        for target, key in ((ln, "layernorm_monitor"), (hs, "hidden_state_monitor")):
            target.update({k: v for k, v in (callbacks.get(key) or {}).items() if k in target})
    return ln, hs


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


# -- the replay ------------------------------------------------------------------------------------------------------
class StagedHistories:
    """Staged post-hoc outputs that ``commit`` puts in place of ``out`` whole: a kill never leaves a mix."""

    NAMES = ("layernorm", "hidden_states")

    def __init__(self, out: Path) -> None:
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


def _replay(checkpoints: Iterator[tuple[int, Any, Any, bool]], initial: Callable[[], dict | None], first_step: int,
            ln_cfg: dict, hs_cfg: dict, texts: Sequence[str] | None, out: Path, device: str
            ) -> tuple[StagedHistories, list[tuple[int, list, dict, dict]]]:
    """Record every ``(step, model, tokenizer, headless)`` with the live monitors' two trackers into staged histories;
    ``initial()`` (called after the first checkpoint loads): the LayerNorm snapshot at init, also written as step 0
    when no checkpoint holds step 0.  Returns the staged files and ``(step, hidden rows, hidden summary, LayerNorm
    summary)`` per checkpoint."""
    from outlierlab.metrics.monitor_records import layernorm_records
    from outlierlab.monitoring.hidden_state_tracker import HiddenStateTracker
    from outlierlab.monitoring.layernorm_tracker import LayerNormTracker

    files = StagedHistories(out)
    ln = LayerNormTracker(rule=ln_cfg["rule"], top_k=ln_cfg["top_k"], histograms=False)
    hs = HiddenStateTracker(**{k: hs_cfg[k] for k in ("n_sequences", "sentences_path", "max_length", "top_k",
                                                      "n_pairs", "seed", "sink_threshold", "w8a8")}, order_use=True)
    records = []
    for step, model, tokenizer, headless in checkpoints:
        if not records:
            ln.initial = initial()
            if ln.initial is not None and first_step != 0:
                files["layernorm"].append(layernorm_records(0, ln.initial, ln.initial, rule=ln.rule, top_k=ln.top_k,
                                                            vectors=ln_cfg["vectors"])[0])
        model = model.to(device).eval()
        ln_rows, ln_summary = ln.compute(model, step, vectors=ln_cfg["vectors"])
        files["layernorm"].append(ln_rows)
        if hs.batch is None:  # one held-out batch for every checkpoint, as a live monitor keeps its first
            hs.tokenize(tokenizer, model, texts)
        hs.headless = headless  # known from the checkpoint: no notice, the vectors' order change at once
        rows, summary = hs.compute(model, step, vectors=hs_cfg["vectors"], device=device)
        files["hidden_states"].append(rows)
        records.append((step, rows, summary, ln_summary))
    return files, records


def _write_order_use(files: StagedHistories, records: list) -> None:
    rows = [{"step": step, **summary["order_use_detail"]} for step, _, summary, _ in records
            if "order_use_detail" in summary]
    write_csv(files.dir / "order_use.csv", rows, _ORDER_USE_FIELDS)


# -- train.py runs ---------------------------------------------------------------------------------------------------
def find_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """``<run>/checkpoints/*.ckpt`` sorted by name; one clear error if there are none."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {run} does not exist")
    ckpts = sorted((run / "checkpoints").glob("*.ckpt"))
    if not ckpts:
        raise FileNotFoundError(f"{run / 'checkpoints'} holds no *.ckpt; pass the directory of a train.py run "
                                "(checkpoints are written every callbacks.model_checkpoint.every_n_train_steps)")
    return ckpts


def analyze_run(run_dir: str | os.PathLike, texts: Sequence[str] | None = None, tokenizer: Any = None,
                out_dir: str | os.PathLike | None = None, device: str = "cpu", **overrides: Any) -> dict[str, Any]:
    """Post-hoc monitor histories for every checkpoint of a ``train.py`` run (texts: the first ``n_sequences`` of
    ``texts``, default the shipped held-out sentences; tokenizer: the run's; out_dir: ``<run>/monitor_posthoc``);
    ``overrides``: monitor settings (``rule``, ``ln_top_k``, ``top_k``, ``n_sequences``, ``n_pairs``, ``seed``,
    ``max_length``, ``vectors``, ``sentences_path``, ``sink_threshold``, ``w8a8``).  Returns the CSV paths and the
    analysed ``steps``."""
    run = Path(run_dir)
    ckpt_paths = find_checkpoints(run)
    ln_cfg, hs_cfg = apply_overrides(*monitor_settings(run), overrides)
    # lazy: a bad directory fails before torch loads; HF_HUB_OFFLINE is read at transformers' import
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from outlierlab.models.checkpoint import model_from_checkpoint, read_checkpoint
    from outlierlab.monitoring import monitor_plots as plots
    from outlierlab.monitoring.layernorm_tracker import initial_from_state

    tokenizer = tokenizer_from(tokenizer, [run / "hf", run / "model", run / "tokenizer"],
                               f"{run} holds no tokenizer (hf/, model/ or tokenizer/ with tokenizer files; train.py "
                               "writes them when training ends); pass --tokenizer DIR")
    by_step: dict[int, Path] = {}  # one checkpoint per step; a step checkpoint wins over last.ckpt of the same step
    for p in sorted(ckpt_paths, key=lambda p: p.name == "last.ckpt"):
        by_step.setdefault(int(read_checkpoint(p, mmap=True).get("global_step", -1)), p)
    first: dict = {}

    def checkpoints():
        for step in sorted(by_step):
            ckpt = read_checkpoint(by_step[step])
            first.setdefault("callbacks", ckpt.get("callbacks") or {})
            yield step, model_from_checkpoint(ckpt, f"checkpoint {by_step[step]}"), tokenizer, False

    def initial():  # the LayerNorm monitor's snapshot at init, kept in the first checkpoint's callback state
        states = [s for k, s in first["callbacks"].items() if "LayerNormMonitor" in str(k) and isinstance(s, dict)]
        return next((initial_from_state(s) for s in states if s.get("initial")), None)

    out = Path(out_dir) if out_dir is not None else run / OUT_SUBDIR
    files, records = _replay(checkpoints(), initial, min(by_step), ln_cfg, hs_cfg, texts, out, device)
    metric_rows: list = []
    for step, rows, _, ln_summary in records:
        metric_rows += [r for r in rows if r[2] in METRIC_COLUMNS and r[1] != "model"]
        # the run's LayerNorm rule, per block (layer.i: hidden state i + 1); no row (not 0) for a block without affine
        # norms; RMSNorm is judged on its gain alone
        metric_rows += [(step, f"layer_{int(name[6:]) + 1}", "n_layernorm_outliers", None, len(dims))
                        for name, dims in ln_summary["outliers"].per_layer.items() if name.startswith("layer.")]
    table = wide_by_layer(metric_rows, METRIC_COLUMNS, with_dims=_WITH_DIMS)
    # the columns of the first row (every row has the same); an empty table still says what it would hold
    write_csv(files.dir / "metrics.csv", table, list(table[0]) if table else ["step", "layer"])
    _write_order_use(files, records)
    plots.save_png(plots.render(plots.metric_curves_figure(plots.curves_from_rows(metric_rows), title=run.name)),
                   files.dir / "metrics.png")
    return {"steps": [r[0] for r in records], "metrics": out / "metrics.csv", "order_use": out / "order_use.csv",
            **files.commit()}


# -- transformers Trainer runs ---------------------------------------------------------------------------------------
def find_hf_checkpoints(output_dir: str | os.PathLike) -> dict[int, Path]:
    """``{global_step: checkpoint dir}`` of a Trainer run holding a model or a PEFT adapter."""
    found = {}
    for d in Path(output_dir).glob(f"{HF_CHECKPOINT_PREFIX}*"):
        suffix = d.name[len(HF_CHECKPOINT_PREFIX):]
        if d.is_dir() and suffix.isdigit() and ((d / "config.json").is_file() or (d / ADAPTER_CONFIG).is_file()):
            found[int(suffix)] = d
    return dict(sorted(found.items()))


def load_hf_checkpoint(path: Path):
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
    """Post-hoc monitor histories for every ``checkpoint-<step>`` of a transformers ``Trainer`` run (``output_dir``),
    each with its LM head (a headless one: its body), so its rows reproduce the live rows of its step.  Divergence
    from init reads ``<monitor_dir>/layernorm_initial.pt`` (default ``<output_dir>/monitor``; also step 0's rows).
    Other arguments as ``analyze_run``; ``out_dir`` default ``<output_dir>/monitor_posthoc``.  Returns the CSV paths
    (``layernorm``, ``hidden_states``, ``order_use``) and the analysed ``steps``."""
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
    from outlierlab.monitoring.loop_monitor import INITIAL_SNAPSHOT

    def checkpoints():
        for step, path in ckpts.items():
            model, headless = load_hf_checkpoint(path)  # headless: a body saved without its head, no loss of its own
            yield step, model, tokenizer_from(tokenizer, [path, run], f"{path} holds no tokenizer (give the Trainer "
                                              "processing_class=tokenizer, or pass tokenizer=...)"), headless

    def initial():  # the live monitor's LayerNorm (gain, bias) at initialisation, float32, if it wrote one
        snapshot = Path(monitor_dir if monitor_dir is not None else run / "monitor") / INITIAL_SNAPSHOT
        if not snapshot.is_file():
            return None
        import torch

        from outlierlab.monitoring.layernorm_tracker import initial_from_state

        return initial_from_state(torch.load(snapshot, map_location="cpu", weights_only=True))

    out = Path(out_dir) if out_dir is not None else run / OUT_SUBDIR
    files, records = _replay(checkpoints(), initial, min(ckpts), ln_cfg, hs_cfg, texts, out, device)
    _write_order_use(files, records)
    return {"steps": list(ckpts), "order_use": out / "order_use.csv", **files.commit()}
