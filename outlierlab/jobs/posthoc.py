"""Outlier statistics of every checkpoint of a finished ``train.py`` run, after the fact.

    python -m outlierlab.jobs.posthoc <run_dir> [--n-sequences 32] [--out DIR]

For each checkpoint step (``last.ckpt`` skipped where a step checkpoint holds its step) the model is rebuilt and
the live monitors' own functions compute the same statistics on the shipped held-out sentences:
``layernorm_records`` (LayerNorm 3σ outliers, divergence from init, shared dims; Kovaleva et al. 2021, Puccetti et al.
2022) and ``hidden_state_records`` (Luo et al. 2021, Ethayarajh 2019, He et al. 2024, Sun et al. 2024, Bondarenko et
al. 2023, Gu et al. 2025).  Output in ``<run>/monitor_posthoc/``: ``layernorm.csv`` and ``hidden_states.csv``;
``metrics.csv``, a row per step and layer (``METRIC_COLUMNS``, with the rogue dims' share, Timkey & van Schijndel
2021, IsoScore, Rudman et al. 2022, and the LayerNorm rule's outlier count); ``metrics.png``; ``order_use.csv``, a
row per checkpoint.

Settings default to the run's monitors' (``<run>/config.yaml``), so with ``source: sentences`` a step's post-hoc rows
reproduce the live ones.  Divergence from init uses the initial LayerNorm snapshot stored in every checkpoint (also
step 0's rows); without it, the standard init (gain 1, bias 0).  A transformers ``Trainer`` output directory
(``checkpoint-<step>/``) goes to ``posthoc_trainer.analyze_hf_checkpoints``.  Imports no Lightning.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from outlierlab.datamodules.eval_data import load_sentences
from outlierlab.jobs.monitor_replay import (HIDDEN_DEFAULTS, LAYERNORM_DEFAULTS, OUT_SUBDIR, StagedHistories,
                                           apply_overrides, hidden_rows, layernorm_kwargs, tokenizer_from)
from outlierlab.jobs.posthoc_trainer import analyze_hf_checkpoints, find_hf_checkpoints
from outlierlab.utils.tables import write_csv

#: Per-layer columns of ``metrics.csv`` (after ``step, layer``); ``*_dim`` columns follow their share.
METRIC_COLUMNS = ("kurtosis", "max_median", "max_abs", "inf_norm_ffn_output", "inf_norm_ln_input",
                  "inf_norm_ln_output", "argmax_share", "argmin_share", "abs_argmax_share", "sink_share_bos",
                  "sink_share_eos", "attn_entropy", "attn_row_mass", "anisotropy", "rogue_top1_share",
                  "rogue_top3_share", "isoscore", "n_layernorm_outliers", "attn_local", "order_use")
_WITH_DIMS = ("max_abs", "argmax_share", "argmin_share", "abs_argmax_share", "rogue_top1_share")


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


def monitor_settings(run_dir: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """(LayerNorm, hidden-state) monitor settings of a run: defaults updated from ``<run>/config.yaml``."""
    ln, hs = dict(LAYERNORM_DEFAULTS), dict(HIDDEN_DEFAULTS)
    cfg_file = Path(run_dir) / "config.yaml"
    if cfg_file.is_file():
        callbacks = OmegaConf.to_container(OmegaConf.load(cfg_file)).get("callbacks") or {}
        for target, key in ((ln, "layernorm_monitor"), (hs, "hidden_state_monitor")):
            target.update({k: v for k, v in (callbacks.get(key) or {}).items() if k in target})
    return ln, hs


def _load(path: Path, mmap: bool = False) -> dict:
    """A checkpoint on CPU (``mmap``: tensors are read lazily, for a cheap look at ``global_step``)."""
    from outlierlab.models.checkpoint import read_checkpoint  # lazy: `python -m outlierlab.jobs.posthoc` checks its arguments before torch loads

    return read_checkpoint(path, mmap=mmap)


def _by_step(ckpt_paths: Sequence[Path]) -> dict[int, Path]:
    """One checkpoint per step; a step checkpoint wins over ``last.ckpt`` of the same step."""
    by_step: dict[int, Path] = {}
    for p in sorted(ckpt_paths, key=lambda p: p.name == "last.ckpt"):
        by_step.setdefault(int(_load(p, mmap=True).get("global_step", -1)), p)
    return by_step


def _initial_snapshot(ckpt: dict) -> dict | None:
    for key, state in (ckpt.get("callbacks") or {}).items():
        if "LayerNormMonitor" in str(key) and isinstance(state, dict) and state.get("initial"):
            from outlierlab.monitoring.layernorm_tracker import initial_from_state

            return initial_from_state(state)
    return None


def analyze_run(run_dir: str | os.PathLike, texts: Sequence[str] | None = None, tokenizer: Any = None,
                out_dir: str | os.PathLike | None = None, device: str = "cpu", **overrides: Any) -> dict[str, Any]:
    """Write post-hoc monitor histories for every checkpoint of ``run_dir`` (default texts: the first
    ``n_sequences`` shipped sentences; tokenizer: the run's; out_dir: ``<run>/monitor_posthoc``); ``overrides``:
    monitor settings (``rule``, ``ln_top_k``, ``top_k``, ``n_sequences``, ``n_pairs``, ``seed``, ``max_length``,
    ``vectors``, ``sentences_path``).  Returns the CSV paths and the analysed ``steps``."""
    run = Path(run_dir)
    ckpt_paths = find_checkpoints(run)
    ln_cfg, hs_cfg = apply_overrides(*monitor_settings(run), overrides)

    # lazy: a bad directory fails before torch loads; HF_HUB_OFFLINE is read at transformers' import
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from outlierlab.metrics.layernorm_rule import layernorm_outliers
    from outlierlab.metrics.monitor_records import layernorm_records, layernorm_snapshot, tokenize_heldout
    from outlierlab.models.checkpoint import model_from_checkpoint
    from outlierlab.models.layernorms import layernorm_tensors, model_layernorms
    from outlierlab.monitoring import monitor_plots as plots
    from outlierlab.monitoring.history import wide_by_layer

    tokenizer = tokenizer_from(tokenizer, [run / "hf", run / "model", run / "tokenizer"],
                               f"{run} holds no tokenizer (hf/, model/ or tokenizer/ with tokenizer files; train.py "
                               "writes them when training ends); pass --tokenizer DIR")
    if texts is None:
        texts = load_sentences(hs_cfg["sentences_path"])[: int(hs_cfg["n_sequences"])]

    by_step = _by_step(ckpt_paths)

    out = Path(out_dir) if out_dir is not None else run / OUT_SUBDIR
    files = StagedHistories(out)
    ln_kw = layernorm_kwargs(ln_cfg)
    done: list[int] = []
    metric_rows: list = []
    order_rows: list[dict] = []
    for step in sorted(by_step):
        ckpt = _load(by_step[step])
        model = model_from_checkpoint(ckpt, f"checkpoint {by_step[step]}").to(device).eval()
        config = model.config
        initial = _initial_snapshot(ckpt)
        if initial is not None and 0 not in by_step and not done:
            files["layernorm"].append(layernorm_records(0, initial, initial, **ln_kw)[0])
        params = layernorm_snapshot(model_layernorms(model))  # the monitor's keys (pre-LN: attention/mlp_input)
        files["layernorm"].append(layernorm_records(step, params, initial, **ln_kw)[0])
        batch = tokenize_heldout(tokenizer, texts, hs_cfg["max_length"] or config.max_len)
        rows, attn = hidden_rows(step, model, batch, hs_cfg, device, getattr(tokenizer, "mask_token_id", None))
        files["hidden_states"].append(rows)
        # the project's one LayerNorm rule (default: output LN, gain AND bias outside 3σ), per block
        det = layernorm_outliers(layernorm_tensors(model_layernorms(model)))
        # no row (not 0) for a block without affine norms; RMSNorm is judged on its gain alone
        ln_counts = [(step, f"layer_{i + 1}", "n_layernorm_outliers", None, len(det.per_layer[f"layer.{i}"]))
                     for i in range(config.num_layers) if f"layer.{i}" in det.per_layer]
        metric_rows += [r for r in rows if r[2] in METRIC_COLUMNS] + ln_counts
        order = order_use_rows(step, model, batch, attn, tokenizer, device)
        order_rows.append({"step": step, **order[0][4]})
        metric_rows += order[1:]
        done.append(step)
    result: dict[str, Any] = {"steps": done}
    table = wide_by_layer(metric_rows, METRIC_COLUMNS, with_dims=_WITH_DIMS)
    # the columns of the first row (every row has the same); an empty table still says what it would hold
    write_csv(files.dir / "metrics.csv", table, list(table[0]) if table else ["step", "layer"])
    write_csv(files.dir / "order_use.csv", order_rows, list(order_rows[0]) if order_rows else ["step", "layer"])
    img = plots.render(plots.metric_curves_figure(plots.curves_from_rows(metric_rows), title=run.name))
    plots.save_png(img, files.dir / "metrics.png")
    result.update(metrics=out / "metrics.csv", order_use=out / "order_use.csv")
    return {**result, **files.commit()}


def order_use_rows(step: int, model, batch: dict, attentions, tokenizer, device: str) -> list[tuple]:
    """Order use and per-block attention locality of one checkpoint on the held-out sentences."""
    from outlierlab.metrics.word_order import heldout_order_use, heldout_special_ids

    special = heldout_special_ids(model.config, tokenizer)
    value, local = heldout_order_use(model, batch, bool(model.config.causal), special,
                                     getattr(tokenizer, "mask_token_id", None), attentions)
    rows = [(step, "model", "order_use", None, value)]  # the whole dict: order_use.csv, not the per-layer table
    if local is not None:
        rows += [(step, f"layer_{i + 1}", "attn_local", None, float(m)) for i, m in enumerate(local["mass"])]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m outlierlab.jobs.posthoc", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a train.py run directory (with checkpoints/), or a transformers Trainer "
                                        "output_dir (with checkpoint-<step>/ folders)")
    parser.add_argument("--out", default=None, help=f"output folder (default <run_dir>/{OUT_SUBDIR})")
    parser.add_argument("--n-sequences", type=int, default=None, help="held-out sentences (default: the run's monitor)")
    parser.add_argument("--sentences", default=None, help="gzip text file, one sentence per line (default: shipped)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: <run>/hf or <run>/model)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("n_sequences", args.n_sequences), ("sentences_path", args.sentences)) if v is not None}
    try:
        if not (Path(args.run_dir) / "checkpoints").is_dir() and find_hf_checkpoints(args.run_dir):
            # a transformers Trainer output_dir (checkpoint-<step>/ folders), e.g. monitored by OutlierMonitorCallback
            res = analyze_hf_checkpoints(args.run_dir, tokenizer=args.tokenizer, out_dir=args.out, device=args.device,
                                         **overrides)
            print(f"analysed steps {res['steps']} -> {res['layernorm']}, {res['hidden_states']}, {res['order_use']}")
            return 0
        find_checkpoints(args.run_dir)  # fail in a second, before importing torch
        from outlierlab.utils.dir_lock import lock_run_dir  # one writer per run directory
        from outlierlab.jobs.run_state import refresh_manifest

        with lock_run_dir(Path(args.run_dir)):
            res = analyze_run(args.run_dir, tokenizer=args.tokenizer, out_dir=args.out, device=args.device, **overrides)
            refresh_manifest(Path(args.run_dir), "posthoc")  # a finished cell's manifest covers the new files
    except (ValueError, FileNotFoundError, OSError, RuntimeError, ImportError) as e:  # ImportError: peft missing
        from outlierlab.jobs.run_errors import disk_full_error, error_line

        # a full disk: the folder and the remedy (the previous generation of outputs is still whole)
        print(f"error: {error_line(e, args.out or args.run_dir) if disk_full_error(e) else e}", file=sys.stderr)
        return 1
    print(f"analysed steps {res['steps']} -> {res['layernorm']}, {res['hidden_states']}, {res['metrics']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
