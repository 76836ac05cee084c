"""The linear probes of ``python probe.py`` and ``ol.probe_positions``: extract (cached) features, fit transforms on
train, probe all layers, report.

Flow: config -> ``FrozenEncoder`` -> ``extract_features`` -> per transform, fit on the TRAINING split ->
``PositionProbe`` / ``SentenceClassifier`` on all layers at once -> a ``ProbeResult`` in memory (``probe``) -> files
in the run dir (``run``, their only writer).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from lightning.pytorch import seed_everything

from outlierlab.metrics.distance_similarity import DistanceSimilarity
from outlierlab.metrics.word_order import cannot_use_order
from outlierlab.metrics.probe_contributions import chance_accuracy, rank_of_dims, top_dims
from outlierlab.metrics.transform_fit import fit_transform
from outlierlab.metrics.transforms import MIN_FIT_RATIO, DegenerateWhiteningError
from outlierlab.datamodules.features import (RowBatches, chunk_outlier_stats, detect_train_outliers, extract_features,
                                             iter_chunks, row_loader)
from outlierlab.models.loading import FrozenEncoder
from outlierlab.datamodules.probe_data import load_classification, load_position_texts, split_indices
from outlierlab.lightning_modules.probes import PositionProbe, SentenceClassifier, train_probe
from outlierlab.configuration.probe_settings import ProbeSettings, check_settings
from outlierlab.evaluation.core import rows_table, selected_transforms
from outlierlab.lightning_modules.loggers import one_console_for_lightning
from outlierlab.reports.probe_report import COLUMNS, LIST_COLUMNS, write_outputs
from outlierlab.utils.tables import write_csv

log = logging.getLogger(__name__)


def transform_settings(tcfg: Mapping, fit_what: str) -> dict:
    """``fit_transform`` keywords from the ``transform`` config node (clip dims, whitening k, abtt D, the guard)."""
    by_layer = tcfg.get("dims_by_layer")
    return {"dims": tcfg.get("dims"), "k": tcfg.get("k"), "fit_what": fit_what, "abtt_d": tcfg.get("abtt_d"),
            "dims_by_layer": dict(by_layer) if by_layer else None,
            "min_ratio": float(tcfg.get("min_fit_ratio", MIN_FIT_RATIO)),
            "allow_degenerate": bool(tcfg.get("allow_degenerate", False))}


def _rows_for(name: str, results: dict, vt, outlier_dims: list[list[int]], common: dict, top_k: int,
              position: bool = False) -> list[dict]:
    """One CSV row per layer for one transform (Luo Fig. 5b/c columns)."""
    rows = []
    contrib = results["contribution"]
    for layer, acc in results["accuracy"].items():
        c = contrib[layer]
        dims = outlier_dims[layer]
        # After whitening or all-but-the-top, coordinate i mixes neurons (whiten: a principal direction): no
        # outlier columns.  Standardize and center keep neuron i at coordinate i.
        comparable = name not in ("whiten", "abtt") and bool(dims)
        rows.append({
            "layer": layer, "transform": name, "accuracy": acc,
            # position task: mean |predicted - true position| (Haviv et al. 2022 read position this way too)
            **({"mean_abs_error": results["mean_abs_error"][layer]} if position else {}),
            "val_accuracy": results.get("val_accuracy", {}).get(layer, float("nan")), **common,
            "top_neurons": ";".join(map(str, top_dims(c, top_k))),
            "outlier_dims": ";".join(map(str, dims)),
            "outlier_rank": ";".join(map(str, rank_of_dims(c, dims))) if comparable else "",
            "contribution_outlier": float(c[dims[0]]) if comparable else float("nan"),
            "contribution_mean": float(c.mean()),
            "clipped_dims": ";".join(map(str, vt.clip_dims[layer])) if vt.clip_dims is not None else "",
            **vt.columns(),  # what a whitened result was fitted on (n, distinct, rank, k, degenerate)
        })
    return rows


def _probe_transforms(cfg, p: ProbeSettings, logger, n_layers: int, dim: int, arrays: dict, labels: dict,
                      fit_what: str, make_module, outliers: list[list[int]], dropped: dict, each=None
                      ) -> tuple[list[dict], dict, dict]:
    """Per selected transform: fitted on the training rows of ``arrays``, a probe ``make_module(name, width)`` on
    every layer at once; ``each(name, result, seconds)`` after each.  The CSV rows (the split sizes, chance and
    ``dropped`` in each), contributions and fits."""
    common = {"n_train": len(labels["train"]), "n_val": len(labels["validation"]), "n_test": len(labels["test"]),
              "chance": chance_accuracy(torch.from_numpy(labels["test"])), **dropped}
    out, contribs, fits = [], {}, {}
    batch_size = int(cfg.task.get("batch_size") or p.batch_size)  # the paper's per-task batch (configs/task)
    say = bool(cfg.progress)  # the fits take minutes: a line before and after each, not silence
    for name in selected_transforms(cfg):
        t0 = time.time()
        vt = fit_transform(name, n_layers, dim, lambda: iter_chunks(*arrays["train"]), outliers,
                           **transform_settings(cfg.transform, fit_what))
        ds = {s: RowBatches(arrays[s][0], arrays[s][1], labels[s], vt) for s in arrays}
        module = make_module(name, vt.out_dim)
        if say:
            print(f"[probe] {name}: fitting one probe per layer, {p.epochs} epoch(s) over {len(labels['train']):,} "
                  "training rows", flush=True)
        t1 = time.time()
        loaders = (row_loader(ds["train"], batch_size, True, int(cfg.seed)),
                   row_loader(ds["validation"], 4 * batch_size, False), row_loader(ds["test"], 4 * batch_size, False))
        res = train_probe(module, *loaders, epochs=p.epochs, logger=logger, accelerator=cfg.trainer.accelerator,
                          progress=bool(cfg.trainer.enable_progress_bar), validate=p.validate)
        if say:
            print(f"[probe] {name}: fitted in {time.time() - t1:.1f} s", flush=True)
        out += _rows_for(name, res, vt, outliers, common, p.top_k, position=True)
        contribs[name] = res["contribution"]
        fits.update({name: vt.info} if name != "none" else {})
        if each is not None:
            each(name, res, time.time() - t0)
    return out, contribs, fits


def run_position(cfg, p: ProbeSettings, encoder: FrozenEncoder, texts: list[str], logger) -> ProbeResult:
    """Luo et al. §3: position probe on token vectors of every layer, per transform."""
    fs = extract_features(encoder, texts, cfg.features.cache_dir, store_tokens=True,
                          batch_size=cfg.encoder.batch_size, progress=bool(cfg.progress))
    n_layers, dim, m = fs.num_layers, fs.dim, p.max_positions
    split = split_indices(fs.meta["n_texts"], p.splits, int(cfg.seed))
    keep = fs.position < m
    if not p.include_special:
        keep &= ~fs.special
    beyond = int((fs.position >= m).sum())
    rows = {s: np.intersect1d(fs.token_rows(ids), np.flatnonzero(keep)) for s, ids in split.items()}
    labels = {s: fs.position[r].astype(np.int64) for s, r in rows.items()}
    stats = chunk_outlier_stats(iter_chunks(fs.tokens, rows["train"]), ~np.asarray(fs.special), n_layers, dim)
    outliers = detect_train_outliers(stats, **cfg.outliers)
    dropped = {"dropped_tokens": beyond + int(fs.meta["truncated_tokens"]),
               "truncated_sequences": int(fs.meta["n_truncated"])}
    by_position = []

    def each(name: str, res: dict, seconds: float) -> None:
        count, acc = res["per_class_count"], res["per_class_accuracy"]
        by_position.extend({"layer": layer, "transform": name, "position": pos, "n_test": int(count[pos]),
                            "accuracy": float(acc[j, pos])}
                           for j, layer in enumerate(sorted(res["accuracy"]))
                           for pos in range(len(count)) if count[pos] > 0)
        log.info("position probe [%s]: %d layers in %.1f s", name, n_layers, seconds)

    try:
        out, contribs, fits = _probe_transforms(
            cfg, p, logger, n_layers, dim, {s: (fs.tokens, r) for s, r in rows.items()}, labels,
            f"the {len(rows['train'])} training token vectors of {len(split['train'])} sentences",
            lambda name, d: PositionProbe(n_layers, d, m, p.lr, seed=int(cfg.seed), tag=name), outliers, dropped, each)
    except DegenerateWhiteningError as e:
        # all the texts, not the training split's: a caller's extra sentences are split in the same shares
        e.texts = int(fs.meta["n_texts"])
        raise
    info = {"task": "position", "n_texts": fs.meta["n_texts"], "n_tokens": fs.meta["n_tokens"],
            "beyond_max_positions": beyond, "max_positions": m, "features": [_where(fs)],
            "outlier_dims": outliers, "transform_fits": fits,
            "notes": ([f"{beyond} tokens at positions >= {m} dropped"] if beyond else [])
            + [f"{t}: {i}" for t, i in fits.items()]}
    result = ProbeResult("position_probe", out, info, contribs)
    # accuracy at each position: a position-free encoder is at chance away from the edges
    result.add_table("position_probe_by_position", by_position, ["layer", "transform", "position", "n_test",
                                                                 "accuracy"])
    # Zuo et al.: nearby tokens more similar than distant ones -> position readable
    result.add_table("similarity_by_distance", similarity_by_distance(fs, p.max_distance or 32),
                     ["layer", "distance", "cosine", "n_pairs"])
    return result


def _where(fs) -> str:
    """Where a feature set lives, for probe_info.json: its cache entry, or memory (``features.cache_dir=null``)."""
    return str(fs.directory) if fs.directory is not None else "in memory (features.cache_dir=null)"


def similarity_by_distance(fs, max_distance: int) -> list[dict]:
    """Mean cosine of two tokens of a sentence by distance, per layer, specials left out (Zuo et al. 2025)."""
    acc = DistanceSimilarity(fs.num_layers, max_distance)
    sid, special = np.asarray(fs.sentence_id), np.asarray(fs.special)
    starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])  # rows of a sentence are contiguous, in order
    for a, b in zip(starts, np.r_[starts[1:], len(sid)]):
        h = torch.from_numpy(np.array(fs.tokens[:, a:b])).unsqueeze(1)  # [L+1, 1, T, d]
        acc.update(h, torch.from_numpy(~special[a:b]).unsqueeze(0))
    return acc.rows()


def run_classifier(cfg, p: ProbeSettings, encoder: FrozenEncoder, logger) -> ProbeResult:
    """Luo et al. §4.4: linear classifier on mean-pooled sentence vectors of every layer, per transform."""
    data = load_classification(cfg.task, int(cfg.seed))
    fss = {s: extract_features(encoder, t, cfg.features.cache_dir, store_tokens=False,
                               batch_size=cfg.encoder.batch_size, progress=bool(cfg.progress))
           for s, (t, _) in data.splits.items()}
    n_layers, dim = fss["train"].num_layers, fss["train"].dim
    labels = {s: np.asarray(y, dtype=np.int64) for s, (_, y) in data.splits.items()}
    if labels["train"].max() >= data.num_classes:
        raise ValueError(f"labels exceed the {data.num_classes} label names")
    arrays = {s: (fs.sentences, np.arange(fs.meta["n_texts"])) for s, fs in fss.items()}
    outliers = detect_train_outliers(fss["train"].outlier_stats(), **cfg.outliers)
    dropped = {"dropped_tokens": sum(int(fs.meta["truncated_tokens"]) for fs in fss.values()),
               "truncated_sequences": sum(int(fs.meta["n_truncated"]) for fs in fss.values())}
    out, contribs, fits = _probe_transforms(
        cfg, p, logger, n_layers, dim, arrays, labels,
        f"the {len(labels['train'])} mean-pooled training sentence vectors",
        lambda name, d: SentenceClassifier(n_layers, d, data.num_classes, p.lr, seed=int(cfg.seed), tag=name,
                                           bias=p.classifier_bias), outliers, dropped)
    info = {"task": str(cfg.task.name), "source": data.source, "labels": data.label_names,
            "features": [_where(fs) for fs in fss.values()], "outlier_dims": outliers,
            "transform_fits": fits, "notes": data.notes + [f"{t}: {i}" for t, i in fits.items()]}
    return ProbeResult("classifier", out, info, contribs)


def layernorm_note(encoder: FrozenEncoder) -> str:
    """One report line: the norms the LayerNorm-outlier rule judges here, the dims it flags, and clip."""
    from outlierlab.metrics.layernorm_rule import LayerNormRule, layernorm_outliers
    from outlierlab.models.layernorms import UnknownFamilyError, layernorm_tensors, model_layernorms

    try:
        norms = model_layernorms(encoder.model)
    except UnknownFamilyError as e:
        return str(e)
    rule = LayerNormRule()
    names = {id(m): n for n, m in encoder.model.named_modules()}
    judged = [names.get(id(m), k) for k, m in norms.items() if rule.selects(k)]
    det = layernorm_outliers(layernorm_tensors(norms), rule)
    shown = ", ".join(f"`{n}`" for n in judged[:2]) + (f", … `{judged[-1]}`" if len(judged) > 2 else "")
    return (f"LayerNorm outlier dims by the rule (judged: {len(judged)} norms, {shown or 'none'}): "
            f"{det.dims or 'none'}{'; bias-free norms judged on their gain alone' if det.gain_only else ''}. "
            "clip zeroes the ACTIVATION outlier dims detected on the training features (`outlier_dims`, Luo et "
            "al. 2021), not these; transform.dims=[...] clips given dims instead.")


@dataclass
class ProbeResult:
    """One probe run in memory: everything ``run`` writes (rows, facts, contributions, side tables)."""

    name: str  # position_probe | classifier: the table's CSV stem
    rows: list[dict]
    info: dict
    contributions: dict
    tables: dict[str, tuple[list[dict], list[str]]] = field(default_factory=dict)
    sections: list[str] = field(default_factory=list)

    def add_table(self, name: str, rows: list[dict], columns: list[str], always: bool = False) -> None:
        """A side table, written as ``<name>.csv``; an empty one only if ``always``."""
        if rows or always:
            self.tables[name] = (rows, columns)

    def frames(self) -> dict[str, Any]:
        """Every table as a DataFrame named by its CSV stem; dim columns stay ``;``-joined strings."""
        import pandas as pd

        main = rows_table(self.rows, COLUMNS)
        for column in LIST_COLUMNS:  # dtype str: the string dtype of this pandas, as read_csv(dtype=str) gives it
            main[column] = pd.Series([v if isinstance(v, str) else float("nan") for v in main[column]],
                                     index=main.index, dtype=str)
        return {self.name: main, **{name: rows_table(rows, cols) for name, (rows, cols) in self.tables.items()}}


def probe(cfg, encoder: FrozenEncoder | None = None, texts: Sequence[str] | None = None,
          logger=None) -> ProbeResult:
    """The probe described by ``cfg``, in memory; ``encoder`` and ``texts`` replace the configured ones."""
    p = check_settings(cfg)
    one_console_for_lightning()
    seed_everything(int(cfg.seed), verbose=False)
    with _quiet_lightning():
        return _probe(cfg, p, encoder, texts, logger)


def run(cfg, run_dir: str | Path, encoder: FrozenEncoder | None = None, texts: Sequence[str] | None = None) -> dict:
    """``probe`` with every output written into ``run_dir``, holding the directory's lock."""
    from outlierlab.utils.dir_lock import lock_run_dir

    run_dir = Path(run_dir)
    with lock_run_dir(run_dir):
        return _run(cfg, run_dir, encoder, texts)


#: The probe's index: its facts and the names of every file the run wrote.
PROBE_INFO = "probe_info.json"


def _run(cfg, run_dir: Path, encoder: FrozenEncoder | None, texts: Sequence[str] | None) -> dict:
    from lightning.pytorch.loggers import TensorBoardLogger

    from outlierlab.reports.run_outputs import output_names, remove_earlier_outputs
    from outlierlab.reports.evaluation_report import log_tables
    from outlierlab.utils.atomic import write_atomic

    check_settings(cfg)  # a refused setting leaves the earlier probe's outputs where they are
    run_dir.mkdir(parents=True, exist_ok=True)
    # before the logger opens its event file: no earlier probe's outputs beside a report that does not name them
    remove_earlier_outputs(run_dir, PROBE_INFO, _listed_outputs, say=("probe", "probe"))
    logger = TensorBoardLogger(str(run_dir), name="tensorboard", version="", default_hp_metric=False)
    result = probe(cfg, encoder, texts, logger)
    # the per-layer results as a table (TensorBoard's text tab), not a series on the probes' training-step axis
    log_tables(logger.experiment, f"probe/{result.name}", result.rows)
    paths = [write_csv(run_dir / f"{name}.csv", rows, cols) for name, (rows, cols) in result.tables.items()]
    paths += write_outputs(result.rows, result.info, run_dir, result.name, result.contributions, result.sections)
    logger.finalize("success")
    # written last, naming every output: its presence means they are all there
    info = {**result.info, "files": output_names(paths, PROBE_INFO, tensorboard=True)}
    write_atomic(run_dir / PROBE_INFO, json.dumps(info, indent=2, default=str))
    paths.append(run_dir / PROBE_INFO)
    return {"rows": result.rows, "info": result.info, "files": paths, "result": result}


def _listed_outputs(earlier: Any) -> list | None:
    """The files an earlier probe_info.json names."""
    if not isinstance(earlier, dict) or "task" not in earlier or "transforms" not in earlier:
        return None  # not a probe's probe_info.json: nothing is removed
    if not isinstance(earlier.get("files"), list):
        raise ValueError(f"the directory's {PROBE_INFO} names no output files: remove its probe outputs, or probe "
                         "into another directory")
    return earlier["files"]


@contextmanager
def _quiet_lightning():
    """Without Lightning's per-Trainer banners and hints, both restored afterwards."""
    names = ("lightning.pytorch", "lightning.fabric")
    levels = {name: logging.getLogger(name).level for name in names}
    with warnings.catch_warnings():
        for pattern in (".*does not have many workers.*", ".*The number of training batches.*", ".*LeafSpec.*"):
            warnings.filterwarnings("ignore", pattern)
        for name in names:
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def order_use(encoder: FrozenEncoder, texts: list[str], seed: int):
    """Whether the model *uses* the order the probe decodes (a learned table's rows are decodable anyway):
    evaluate.py's ``order_use`` on the probe's first sentences, its rows and a report section."""
    from outlierlab.evaluation.analyses.order_use import measure
    from outlierlab.configuration.analysis_settings import OrderUseSettings
    from outlierlab.models.lm_model import load_mlm

    s = OrderUseSettings()
    texts = texts[: s.max_sentences]
    return measure(load_mlm(encoder), texts, f"the probe's first {len(texts)} sentences", s, seed)


def _probe(cfg, p: ProbeSettings, encoder: FrozenEncoder | None, texts: Sequence[str] | None, logger) -> ProbeResult:
    if encoder is None:
        encoder = FrozenEncoder.from_config(cfg.encoder)  # + dtype, device_map, revision (configs/encoder/)
    position = str(cfg.task.kind) == "position"
    measure_use = position and p.order_use
    if measure_use:
        encoder.lm_head = True  # before the weights load (if not loaded yet): one copy, head included
    if position:
        texts = list(texts) if texts is not None else load_position_texts(cfg.data.files, cfg.data.max_sentences)
        result = run_position(cfg, p, encoder, texts, logger)
    else:
        result = run_classifier(cfg, p, encoder, logger)
    result.info.update(encoder=str(encoder.source.name), encoder_kind=encoder.source.kind,
                       layers=encoder.num_layers + 1, hidden=encoder.hidden_size,
                       transforms=selected_transforms(cfg), seed=int(cfg.seed),
                       family=encoder.family_line(), layernorms=layernorm_note(encoder),
                       orderless=cannot_use_order(getattr(encoder, "pos", None), getattr(encoder, "causal", False)))
    if measure_use:
        from outlierlab.evaluation.analyses.order_use import COLUMNS as USE_COLUMNS

        used = order_use(encoder, texts, int(cfg.seed))
        result.info["order_use"], result.sections = used.summary, [used.markdown]
        result.add_table("order_use", used.rows, USE_COLUMNS, always=True)
        result.add_table("order_use_layers", *used.tables["order_use_layers"], always=True)
    return result
