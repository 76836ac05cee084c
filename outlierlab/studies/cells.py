"""The cells of a sweep and their numbers, in one long table: what ``outlierlab.studies.aggregate`` aggregates.

A *cell* is one run directory of a Hydra multirun (``train.py``, ``evaluate.py`` or ``probe.py``): its
``.hydra/overrides.yaml`` says what was set, its resolved ``config.yaml`` (or ``.hydra/config.yaml``) what
ran, ``finished.json`` (train.py) whether it completed. Its numbers come from the CSVs it wrote:

* ``monitor/hidden_states.csv``, ``monitor/layernorm.csv`` (the live monitors; long format, one row per step
  x layer x statistic, ``outlierlab.monitoring.history``) -> metrics ``hidden/<statistic>``,
  ``layernorm/<statistic>`` (per-dimension rows such as ``mean`` or ``gain`` are vectors, not aggregated);
* ``monitor_posthoc/metrics.csv`` (``python -m outlierlab.jobs.posthoc``; one row per checkpoint x layer)
  -> ``posthoc/<column>``; ``monitor_posthoc/order_use.csv`` -> ``posthoc/order_use`` at layer ``model``;
* ``csv/metrics.csv`` (Lightning's CSV logger) -> ``val/ppl``, ``train/loss``, ... at layer ``model`` (not its
  bookkeeping: learning rate, throughput, batch counters);
* any other CSV at the cell's top with a ``layer`` column (``evaluate.py``'s ``anisotropy.csv``, ...,
  ``probe.py``'s ``position_probe.csv``) -> ``<file>/<key columns>/<column>`` at step -1.

Per-layer monitor metrics also get a derived layer ``max_layer``: the largest value over the encoder layers
(``layer_1`` .. ``layer_L``, not the embedding output), taken within each run before averaging.

Cells that cannot be read wrong (``outlierlab.studies.cell_checks``): a training cell is finished when the trainer's
marker (``outlierlab.jobs.run_state.finished_run``) covers the budget its config asks for, and its files are checked
against its manifest, or without one (its code version then unknown) for what a crash or copy leaves.  A torn
``.hydra/overrides.yaml`` or ``config.yaml`` is one problem line, not a traceback; a cell with any problem is
unusable, listed and never averaged.  A scalar statistic with more than one row per step is an error naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from outlierlab.studies.cell_checks import UNKNOWN_CODE, check_cell, code_version, finished, resumed_with_changes
from outlierlab.jobs.run_resume import dotted_keys
from outlierlab.jobs.run_state import code_versions
from outlierlab.jobs.series import apply_series
from outlierlab.studies.table import is_cell, resolve
from outlierlab.utils.tables import MODEL_STEP, read_metrics

#: Overrides that do not change what a cell computes: how it was launched, resumed or named, and where its caches live
#: (``paths.cache_dir``: the same cells run on another machine set it; ``SEED_DEPENDENT`` below ignores it already).
#: Each also excludes every key under it (``posthoc_probe.max_sentences=200``), as in the cells' directory names
#: (:func:`outlierlab.configuration.composing.cell_overrides`).
NOT_IDENTITY = {"study", "ckpt_path", "resume", "skip_finished", "threads", "paths", "posthoc", "posthoc_probe",
                "trainer.enable_progress_bar", "callbacks.progress.when", "progress", "tensorboard", "plots"}
#: Resolved-config keys that legitimately differ between the seeds of one group: the seed itself, where a
#: run writes, and how its work is scheduled (processes, threads, chunk sizes), which does not change a number.
SEED_DEPENDENT = re.compile(r"(^|\.)(seed|run_dir|save_dir|dirpath|out_dir|study|num_proc|num_workers|"
                            r"tokenize_chunk_mb|pin_memory|threads)$|^hydra\.|^paths\.|^study_design\.")
SEED_IN_VALUE = re.compile(r"seed=(\d+)")
LAYER_MAX = "max_layer"
#: Lightning's bookkeeping scalars (learning rate, throughput, batch counters): not results, left out.
BOOKKEEPING = re.compile(r"^(lr-|epoch$|train/(batches|lengths|samples|time)$|train/device/|validate/)")
#: Monitor statistics with one row per dimension, head or detected dim (vectors and lists, not scalars).
VECTOR_STATISTICS = {"mean", "gain", "bias", "top_abs_mean", "outlier_dim", "gain_outlier", "bias_outlier",
                     "attn_entropy_head", "top_gain_z", "top_bias_z", "rule_outlier"}
#: Monitor rows that are identifiers, counts fixed by the setting, or standard errors: not quantities to average.
NOT_QUANTITIES = re.compile(r"^(max_abs_token_id|n_tokens|n_anisotropy_pairs|min_layers|.*_se)$")


@dataclass
class Cell:
    path: Path
    overrides: dict[str, str]          # identity: every override but the seed (a seed inside a value -> seed=*)
    seed: int | None
    finished: bool
    config: dict[str, Any] = field(default_factory=dict)  # flattened resolved config
    problems: list[str] = field(default_factory=list)    # '<cell>: <file>: <what>'; any -> unusable
    code: str = UNKNOWN_CODE                              # '<commit>[-dirty]', 'unknown' without a manifest
    notes: list[str] = field(default_factory=list)       # e.g. 'no manifest: code version unknown'
    series_step: int | None = None                        # a published checkpoint's step (outlierlab.jobs.series)
    cut_at: int | None = None                             # stopped before its budget, admitted up to this step

    @property
    def usable(self) -> bool:
        return (self.finished or self.cut_at is not None) and not self.problems

    @property
    def max_steps(self) -> Any:
        return self.config.get("trainer.max_steps")


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:160]


def _read_config(path: Path, problems: list[str]) -> dict[str, Any]:
    for candidate in (path / "config.yaml", path / ".hydra" / "config.yaml"):
        if candidate.is_file():
            try:
                cfg = OmegaConf.load(candidate)
                return dotted_keys(OmegaConf.to_container(cfg, resolve=False))
            except Exception as e:  # a torn file: the cell is reported, not silently dropped
                problems.append(f"{path}: {candidate.relative_to(path)}: unreadable ({_one_line(e)})")
                return {}
    return {}


def read_cell(path: Path) -> Cell:
    """One cell: its identity (overrides without the seed), seed, completion and resolved config."""
    overrides: dict[str, str] = {}
    seed: int | None = None
    problems: list[str] = []
    file = path / ".hydra" / "overrides.yaml"
    try:
        items = OmegaConf.to_container(OmegaConf.load(file)) if file.is_file() else []
        if items is not None and not isinstance(items, list):
            raise ValueError(f"a list of key=value overrides expected, got {type(items).__name__}")
    except Exception as e:  # torn: one line naming the cell and the file, the cell is unusable
        problems.append(f"{path}: .hydra/overrides.yaml: unreadable ({_one_line(e)})")
        items = []
    for item in items or []:
        key, _, value = str(item).partition("=")
        key = key.lstrip("+~")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":  # a quoted value (paths with ',' or '=')
            value = value[1:-1]
        if key.startswith(("hydra.", "hydra/")) or any(key == k or key.startswith((k + ".", k + "/"))
                                                        for k in NOT_IDENTITY):
            continue
        if key == "seed":
            seed = int(value)
            continue
        found = SEED_IN_VALUE.search(value)
        if found:  # e.g. evaluate.py over the seeds' runs: encoder.name_or_path=multirun/x/pos=none,seed=2
            seed = int(found.group(1)) if seed is None else seed
            value = SEED_IN_VALUE.sub("seed=*", value)
        overrides[key] = value
    config = _read_config(path, problems)
    series_seed, series_step = apply_series(overrides, config)  # checkpoint series: step/seed in a revision or name
    seed = series_seed if series_seed is not None else seed
    if seed is None and isinstance(config.get("seed"), int):
        seed = int(config["seed"])
    cell = Cell(path, overrides, seed, finished(path, config, problems), config, problems, series_step=series_step)
    if cell.finished and not problems:
        cell.problems, cell.code, cell.notes = check_cell(path, data_files(path))
    return cell


def find_cells(paths: list[str | Path], until: int | None = None) -> list[Cell]:
    """Cells under each path (a sweep directory, a cell itself, or a study table: ``outlierlab.studies.table``):
    the paths in the order given, the cells of one path by their run directory's name; with ``until``, the training
    cells stopped before their budget admitted up to that step (``admit_cut``).

    This order is the order of a study's groups (study.md's columns, contrasts.csv's pairs), so it does not depend
    on where a path lives (a packed table unpacks into a cache folder named by the hash of its bytes)."""
    cells = []
    for p in map(resolve, paths):  # a packed study (.parquet) reads as the folder it was packed from
        if not p.is_dir():
            raise FileNotFoundError(f"{p} is not a directory (give a multirun sweep directory or run directories)")
        found = [p] if is_cell(p) else sorted((c for c in p.iterdir() if c.is_dir() and is_cell(c)),
                                              key=lambda c: c.name)
        cells += [read_cell(c) for c in found]
    if not cells:
        raise ValueError(f"no run directories (with .hydra/overrides.yaml) under {', '.join(map(str, paths))}")
    if until is not None:
        for cell in cells:
            admit_cut(cell, until)
    return cells


# ----------------------------------------------------------------------------------------------- numbers
#: Metrics read under the name they have now (one name per quantity; ``_current_statistics`` says which cells differ).
RENAMED = {"hidden/token_pair_cosine": "hidden/anisotropy"}


def current_name(metric: str) -> str:
    """``metric`` under its name now (``RENAMED``): what a declared design or a command line may still call it."""
    return RENAMED.get(metric, metric)


def _current_statistics(df: pd.DataFrame) -> pd.DataFrame:
    """A hidden-state history with its statistics under today's names: ``token_pair_cosine`` is ``anisotropy``, and
    an ``anisotropy`` of other values beside it (the 16-pair estimate of a cell that old) is
    ``anisotropy_one_per_sentence``, unless the cell holds that already."""
    stats = df["statistic"].astype(str)
    if not (stats == "token_pair_cosine").any():
        return df
    old = stats == "anisotropy"
    key = ["step", "name"]
    pairs = df[stats == "token_pair_cosine"].set_index(key)["value"]
    same = df.loc[old].set_index(key)["value"].sub(pairs, fill_value=float("nan")).abs().le(1e-12).all()
    df = df.copy()
    if same or (stats == "anisotropy_one_per_sentence").any():
        df = df[~old]
    else:
        df.loc[old, "statistic"] = "anisotropy_one_per_sentence"
    df.loc[df["statistic"] == "token_pair_cosine", "statistic"] = "anisotropy"
    return df


def _long_history(path: Path, prefix: str) -> pd.DataFrame:
    df = pd.read_csv(path)
    if df.empty:
        return df
    if prefix == "hidden/":
        df = _current_statistics(df)
    df = df[~df["statistic"].isin(VECTOR_STATISTICS) & ~df["statistic"].astype(str).str.match(NOT_QUANTITIES)]
    dupes = df[df.duplicated(["step", "name", "statistic"], keep=False)]
    if not dupes.empty:
        r = dupes.iloc[0]
        raise ValueError(f"{path}: statistic {r['statistic']!r} has {int((dupes['statistic'] == r['statistic']).sum())} "
                         f"rows at step {r['step']}, {r['name']} (one expected); a per-dimension statistic must be "
                         "listed in study_cells.VECTOR_STATISTICS")
    return pd.DataFrame({"step": df["step"].astype(int), "layer": df["name"].astype(str),
                         "metric": prefix + df["statistic"].astype(str), "value": pd.to_numeric(df["value"], errors="coerce")})


def _posthoc(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    if df.duplicated(["step", "layer"]).any():
        r = df[df.duplicated(["step", "layer"])].iloc[0]
        raise ValueError(f"{path}: step {r['step']}, layer {r['layer']} has more than one row (one expected)")
    cols = [c for c in df.columns if c not in ("step", "layer") and not c.endswith("_dim")]
    long = df.melt(id_vars=["step", "layer"], value_vars=cols, var_name="metric", value_name="value")
    layer = long["layer"].astype(str)
    long["layer"] = layer.where(~layer.str.fullmatch(r"\d+"), "layer_" + layer)
    long["metric"] = "posthoc/" + long["metric"]
    long["value"] = pd.to_numeric(long["value"], errors="coerce")
    return long


def _order_use(path: Path) -> pd.DataFrame:
    """One row per checkpoint: the model's order use, not a layer's."""
    df = pd.read_csv(path)
    return pd.DataFrame({"step": df["step"].astype(int), "layer": "model", "metric": "posthoc/order_use",
                         "value": pd.to_numeric(df["order_use"], errors="coerce")})


def _lightning_csv(path: Path) -> pd.DataFrame:
    df = read_metrics(path)  # every row at the step of the model it measured
    cols = [c for c in df.columns if c not in ("step", "epoch", MODEL_STEP)]
    long = df.melt(id_vars=["step"], value_vars=cols, var_name="metric", value_name="value").dropna(subset=["value"])
    long = long[~long["metric"].str.match(BOOKKEEPING)]
    long = long.groupby(["step", "metric"], as_index=False).last()  # one value per step (the last logged)
    long["layer"] = "model"
    return long


#: Columns of evaluate.py/probe.py CSVs that say WHICH row it is (folded into the metric name); every other
#: non-numeric column is a description (dims listed as text, fit notes) and is not aggregated.
KEY_COLUMNS = ("transform", "dataset", "genre", "task", "split", "condition", "rule", "objective", "site", "head")


def _layer_csv(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    keys = [c for c in KEY_COLUMNS if c in df.columns]
    if df.duplicated(subset=["layer", *keys]).any():  # several rows per layer: a per-dimension file, not scalars
        return pd.DataFrame()
    numeric = [c for c in df.columns if c != "layer" and c not in keys and pd.api.types.is_numeric_dtype(df[c])
               and not df[c].isna().all()]
    rows = []
    for _, r in df.iterrows():
        tag = "/".join(str(r[k]) for k in keys)
        for c in numeric:
            rows.append({"step": -1, "layer": f"layer_{r['layer']}" if str(r["layer"]).isdigit() else str(r["layer"]),
                         "metric": "/".join(x for x in (path.stem, tag, c) if x), "value": r[c]})
    return pd.DataFrame(rows)


def _add_max_layer(df: pd.DataFrame) -> pd.DataFrame:
    per_layer = df[df["layer"].str.fullmatch(r"layer_\d+") & (df["layer"] != "layer_0")
                   & df["metric"].str.match(r"(hidden|posthoc)/")]
    if per_layer.empty:
        return df
    mx = per_layer.groupby(["step", "metric"], as_index=False)["value"].max()
    mx["layer"] = LAYER_MAX
    return pd.concat([df, mx[df.columns]], ignore_index=True)


#: The CSVs of a cell that hold numbers, each with its reader into long rows (beside every top-level CSV with a
#: ``layer`` column, :func:`_layer_csv`).
READERS = {"monitor/hidden_states.csv": partial(_long_history, prefix="hidden/"),
           "monitor/layernorm.csv": partial(_long_history, prefix="layernorm/"),
           "monitor_posthoc/metrics.csv": _posthoc, "monitor_posthoc/order_use.csv": _order_use,
           "csv/metrics.csv": _lightning_csv}


def data_files(path: Path) -> list[str]:
    """The CSVs ``cell_numbers`` reads, relative to the cell."""
    return [r for r in READERS if (path / r).is_file()] + [f.name for f in sorted(path.glob("*.csv"))]


def cell_numbers(cell: Cell) -> pd.DataFrame:
    """Every scalar the cell wrote: columns ``step, layer, metric, value``."""
    p = cell.path
    parts = [read(p / rel) for rel, read in READERS.items() if (p / rel).is_file()]
    parts += [_layer_csv(f) for f in sorted(p.glob("*.csv")) if "layer" in pd.read_csv(f, nrows=1).columns]
    parts = [x for x in parts if not x.empty]
    if not parts:
        return pd.DataFrame(columns=["step", "layer", "metric", "value"])
    df = pd.concat([x[["step", "layer", "metric", "value"]] for x in parts], ignore_index=True)
    df = df.dropna(subset=["value"])
    if cell.series_step is not None:  # evaluate.py/probe.py numbers (step -1) of a published checkpoint
        df.loc[df["step"] == -1, "step"] = cell.series_step
    return _add_max_layer(df)


def admit_cut(cell: Cell, until: int) -> None:
    """Admit a training cell stopped before its budget (a wall-clock cut, a killed job) up to step ``until``:
    it counts when its files are intact and its numbers reach ``until``; ``outlierlab.studies.aggregate.aggregate``
    then drops every cell's rows after ``until``, so all groups are compared on the same steps.  Its code version
    comes from ``code_versions.jsonl`` (written at every start), as the manifest is written only at the end."""
    if cell.finished or cell.problems or not isinstance(cell.max_steps, int):  # not a training cell
        return
    problems, _, _ = check_cell(cell.path, data_files(cell.path))
    if problems:
        cell.problems = problems
        return
    numbers = cell_numbers(cell)
    if numbers.empty or int(numbers["step"].max()) < until:
        return
    cell.cut_at = until
    cell.code = code_version({"code_versions": code_versions(cell.path)})
    cell.notes.append(f"{cell.path.name}: stopped at step {int(numbers['step'].max())} of {cell.max_steps}, "
                      f"compared up to step {until}")
    cell.notes += resumed_with_changes(cell.path)  # a cut cell has no manifest, and is the likeliest to be resumed


#: Trainer settings whose null is Lightning's default value (``Trainer(limit_val_batches=None)`` runs every batch, as
#: 1.0 does): cells written before and after configs/trainer/default.yaml moved from the explicit 1.0 to null ran alike.
LIGHTNING_NULL_DEFAULTS = {f"trainer.limit_{split}_batches": 1.0 for split in ("train", "val", "test", "predict")}


def portable_config(cell: Cell) -> dict:
    """The cell's resolved config with its own directory written as ``<cell>`` (paths inside it differ by
    construction), a ``seed=N`` inside a value (a path to one seed's run) as ``seed=*`` and a null Lightning
    default as its value (``LIGHTNING_NULL_DEFAULTS``)."""
    here = str(cell.path.resolve())
    config = {k: (SEED_IN_VALUE.sub("seed=*", v.replace(here, "<cell>")) if isinstance(v, str) else v)
              for k, v in cell.config.items()}
    return {k: (LIGHTNING_NULL_DEFAULTS.get(k) if v is None else v) for k, v in config.items()}
