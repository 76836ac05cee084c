"""The evaluation itself, in memory: every selected analysis (``outlierlab.evaluation.registry``) on one frozen
encoder, their rows returned as tables.  Nothing is written here but the figures of a run that asks for them.

``ol.evaluate`` returns what ``run_analyses`` computes and ``run_writer`` writes it, so the command line and the
Python API are equal by construction.  The checks before the model loads need no torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from outlierlab.datamodules.validation import validate_inputs
from outlierlab.evaluation.registry import (ANALYSIS_MODULES, RUN_SETTINGS, SETTINGS, AnalysisResult, EvalContext,
                                            SharedPasses)
from outlierlab.configuration.run_settings import EncoderSettings
from outlierlab.configuration.settings_store import section_settings


# ----------------------------------------------------------------------------------- light validation
def analysis_module(name: str) -> str:
    """The module of analysis ``name``: a built-in's, or ``name`` itself when it is a dotted module path."""
    return ANALYSIS_MODULES.get(name, name)


def selected_analyses(cfg, given: Mapping[str, Any] | None = None) -> list[str]:
    """``analyses=[...]`` checked against the registry, the import path and the objects ``given`` (no torch)."""
    names = cfg.get("analyses")
    names = [names] if isinstance(names, str) else [str(n) for n in (names or [])]
    if not names:
        raise ValueError(f"analyses is empty; choose from {', '.join(ANALYSIS_MODULES)}")
    for n in names:
        if n in (given or {}):
            continue
        if n not in ANALYSIS_MODULES and "." not in n:
            raise ValueError(f"unknown analysis {n!r}; valid: {', '.join(ANALYSIS_MODULES)}, or the module path "
                             "of your own (analyses=[outliers,mypkg.my_analysis])")
        try:
            found = importlib.util.find_spec(analysis_module(n)) is not None
        except ModuleNotFoundError:  # its package is missing
            found = False
        if not found:
            raise ValueError(f"analysis {n!r}: module {analysis_module(n)} cannot be imported (not installed, or "
                             "not on PYTHONPATH)")
    return list(dict.fromkeys(names))


def given_analyses(analyses: Sequence[Any]) -> dict[str, Any]:
    """The analysis objects of ``analyses`` by name; a name may be neither a built-in's nor a second object's."""
    given: dict[str, Any] = {}
    for analysis in (a for a in analyses if not isinstance(a, str)):
        name = analysis_name(analysis)
        if name in ANALYSIS_MODULES:
            raise ValueError(f"analysis {analysis!r} is named {name!r}, as a built-in analysis: give it a NAME of its "
                             "own (its table comes back by that name)")
        if given.get(name, analysis) is not analysis:
            raise ValueError(f"two analysis objects are named {name!r}: give each a NAME of its own")
        given[name] = analysis
    return given


def analysis_name(analysis) -> str:
    """The name an analysis object is selected and written (``<name>.csv``) by: its ``NAME``, else ``__name__``."""
    name = getattr(analysis, "NAME", None) or getattr(analysis, "__name__", None)
    if not name or not callable(getattr(analysis, "run", None)):
        raise ValueError(f"analysis {analysis!r}: expected a name (str) or an object with run(ctx) and a NAME")
    return str(name)


def selected_transforms(cfg) -> list[str]:
    """The transforms ``transform.use`` selects, in ``outlierlab.metrics.transforms.TRANSFORMS`` order."""
    from outlierlab.metrics.transforms import TRANSFORMS  # imports torch: after the settings and files are checked

    use = (cfg.get("transform") or {}).get("use") or {}
    names = [n for n in TRANSFORMS if use.get(n)]
    bad = [n for n, on in use.items() if on and n not in TRANSFORMS]
    if bad or not names:
        raise ValueError(f"unknown or no transform {bad}; valid: transform=[{','.join(TRANSFORMS)}] (any subset)")
    return names


def check_settings(cfg, analyses: list[str]) -> dict[type, Any]:
    """Every config section the run reads as its typed settings, by class: a bad key or value fails in one line."""
    return {cls: section_settings(cls, cfg)
            for cls in dict.fromkeys([*RUN_SETTINGS, *(SETTINGS[n] for n in analyses if n in SETTINGS)])}


@dataclass
class Evaluation:
    """What one evaluation computed: each analysis' result, the run's facts (``meta``) and each CSV's header."""

    results: list[AnalysisResult]
    meta: dict[str, Any]
    columns: dict[str, list[str]] = field(default_factory=dict)

    def tables(self) -> dict[str, Any]:
        """One DataFrame per table, as its CSV; ``attrs["skipped"]`` says why a skipped analysis has no rows."""
        out = {}
        for res in self.results:
            out[res.name] = rows_table(res.rows, self.columns[res.name])
            if res.summary.get("skipped"):
                out[res.name].attrs["skipped"] = res.summary["skipped"]
            out.update({name: rows_table(rows, cols) for name, (rows, cols) in res.tables.items()})
        return out


def rows_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]):
    """``rows`` as a DataFrame of ``columns`` (what ``outlierlab.utils.tables.write_csv`` writes, as values)."""
    import pandas as pd

    from outlierlab.utils.tables import joined

    def cell(v):
        v = joined(v)
        return None if v is None or (isinstance(v, str) and v == "") else v

    frame = pd.DataFrame([[cell(r.get(c)) for c in columns] for r in rows], columns=list(columns)).infer_objects()
    for c in frame.columns[frame.isna().all()]:  # no value at all: what the CSV reads back, float NaN, not None
        frame[c] = frame[c].astype(float)
    return frame


def run_analyses(cfg, encoder=None, given: Mapping[str, Any] | None = None, texts: Sequence[str] | None = None,
                 out_dir: str | Path | None = None, tb=None) -> Evaluation:
    """Every analysis ``cfg.analyses`` selects on one frozen encoder, in memory; ``given``: analysis objects by
    name; ``texts``: in place of ``data.files``; ``out_dir``: figures (None: none)."""
    given = dict(given or {})
    analyses = selected_analyses(cfg, given)
    settings = check_settings(cfg, analyses)
    validate_inputs(cfg, "evaluate", check_encoder=encoder is None)  # every data file usable, before the model loads
    plots = cfg.get("plots", True)
    if not isinstance(plots, bool):
        raise ValueError(f"plots={plots!r}: expected true (PNG figures) or false (CSVs, report and JSON only)")
    plots = plots and out_dir is not None
    seed = cfg.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):  # int('abc') below would not name the key
        raise ValueError(f"seed={seed!r}: expected an integer (it seeds every sampled draw of the run)")
    t_start = time.time()
    # torch and the models load only after every setting and file above was checked (fails in a second)
    transforms = selected_transforms(cfg)
    import torch

    from outlierlab.models.loading import FrozenEncoder

    torch.manual_seed(int(cfg.seed))
    if encoder is None:
        encoder = FrozenEncoder.from_config(settings[EncoderSettings])  # + dtype, device_map, revision
    modules = {name: given[name] if name in given else importlib.import_module(analysis_module(name))
               for name in analyses}
    if any(getattr(m, "LM_HEAD", False) for m in modules.values()):
        encoder.lm_head = True  # before the weights load: one copy, head included
    # the sentence pass and the MLM model, computed once for every analysis
    shared = SharedPasses(texts=None if texts is None else list(texts), settings=settings)
    contexts = {}
    for name in analyses:
        section = cfg.get(name.rsplit(".", 1)[-1])
        contexts[name] = EvalContext(encoder, section or OmegaConf.create({}), cfg, transforms,
                                     None if out_dir is None else Path(out_dir), int(cfg.seed), tb, shared,
                                     plots=plots)
    from outlierlab.evaluation.sentence_pass import pass_needs, sentence_stats

    needs = {name: pass_needs(modules[name], contexts[name]) for name in analyses}
    shared.needs = set().union(*needs.values())
    for name in analyses:  # data problems (missing file, offline hub name) fail before any encoding
        if hasattr(modules[name], "check"):  # its data (WiC pairs, STS sets) is handed to its run()
            contexts[name].prepared = modules[name].check(contexts[name])
        if hasattr(modules[name], "consumers"):  # its subscribers to the shared sentence stream
            contexts[name].consumers = [shared.subscribe(c) for c in modules[name].consumers(contexts[name])]
    if shared.consumers:  # the shared pass feeds them, whichever analysis would have started it
        sentence_stats(next(contexts[n] for n in analyses if contexts[n].consumers))
    results = []
    for i, name in enumerate(analyses):
        t0 = time.time()
        res = modules[name].run(contexts[name])
        if not isinstance(res, AnalysisResult) or res.name != name:  # its table is looked up and written by name
            got = f"AnalysisResult named {res.name!r}" if isinstance(res, AnalysisResult) else type(res).__name__
            raise ValueError(f"analysis {name!r}: run(ctx) returned {got}; return "
                            f"ol.AnalysisResult({name!r}, rows, markdown)")
        res.summary["seconds"] = round(time.time() - t0, 2)
        _fit_columns(res, shared, needs[name], contexts[name].consumers)
        results.append(res)
        why = f" (skipped: {res.summary['skipped']})" if res.summary.get("skipped") else ""
        if cfg.get("progress", True):  # progress=False (ol.evaluate in a notebook): the tables say it all
            print(f"[evaluate] {name}: {len(res.rows)} rows in {time.time() - t0:.1f} s{why}", flush=True)
        if shared.sentence_stats is not None and not any(needs[n] for n in analyses[i + 1:]):
            shared.sentence_stats.release_layer_state()  # its [L, d, d] maps, before WiC/STS fit theirs
        _release_consumers(contexts, analyses[i:])
    meta = _meta(cfg, encoder, analyses, transforms, shared, time.time() - t_start)
    # the transforms are compared only where some table has a transform column (not in the ablation, order use...)
    meta["transformed"] = any("transform" in r for res in results for r in res.rows)
    return Evaluation(results, meta, _columns(results, modules))


def _release_consumers(contexts: Mapping[str, EvalContext], analyses: Sequence[str]) -> None:
    """Free the subscribers of ``analyses[0]`` no later analysis reads (e.g. the anisotropy reservoir)."""
    later = {id(c) for n in analyses[1:] for c in contexts[n].consumers}
    shared = contexts[analyses[0]].shared
    shared.consumers = [c for c in shared.consumers if id(c) in later or c not in contexts[analyses[0]].consumers]
    contexts[analyses[0]].consumers = []


def _columns(results: list[AnalysisResult], modules: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each table's header: its ``COLUMNS`` plus its fit columns, else its rows' keys (layer, transform first)."""
    from outlierlab.metrics.transforms import FITTED
    from outlierlab.utils.tables import columns_of

    out = {}
    for res in results:
        cols = getattr(modules[res.name], "COLUMNS", None)
        if not cols:
            out[res.name] = columns_of(res.rows, ("layer", "transform"))
            continue
        extra = [k for r in res.rows for k in r if k.startswith(tuple(f"{n}_" for n in FITTED))]
        out[res.name] = list(cols) + [k for k in dict.fromkeys(extra) if k not in cols]
    return out


def _fit_columns(res, shared, needs: set[str], consumers: list) -> None:
    """Add what their map was fitted on to an analysis' fitted rows computed on the shared pass."""
    from outlierlab.metrics.transforms import FITTED

    st = shared.sentence_stats
    if not (needs - {"fitted_maps"} or consumers) or st is None:
        return
    cols = {name: st.transforms.columns(name) for name in FITTED}
    for r in res.rows:
        if r.get("transform") in FITTED:
            r.update({k: v for k, v in cols[r["transform"]].items() if k not in r})


def _meta(cfg, encoder, analyses, transforms, shared, seconds) -> dict:
    st = shared.sentence_stats
    meta = {"command": " ".join(sys.argv), "encoder": encoder.source.name, "encoder_kind": encoder.source.kind,
            "layers": encoder.num_layers + 1, "hidden": encoder.hidden_size, "device": str(encoder.device),
            "max_length": encoder.max_length, "family": encoder.family_line(), "analyses": analyses,
            "transforms": transforms,
            "whiten_fit_on": str(cfg.transform.fit_on),
            "seed": int(cfg.seed), "seconds": round(seconds, 1)}
    if st is not None:
        meta["sentences"] = {"n": st.n_sentences, "source": st.settings.get("source"), "passes": len(st.passes),
                             "tokens_encoded": sum(p.n_tokens for p in st.passes),
                             "tokens_per_s": round(st.tokens_per_s, 1), "transforms": dict(st.transforms.info),
                             "notes": st.notes}
    return meta
