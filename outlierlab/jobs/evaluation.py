"""The evaluate job behind ``python evaluate.py`` and :func:`outlierlab.api.evaluate`: settings and files checked
(no torch), then one frozen encoder, every selected analysis (:mod:`outlierlab.evaluation.registry`) and the outputs
(``<analysis>.csv``, ``report.md``, ``results.json``, figures, TensorBoard) in one run directory.

Kept out of ``evaluate.py`` so that the entry point stays thin and the Python API runs the very same code.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from outlierlab.datamodules.validation import validate_inputs
from outlierlab.evaluation.registry import ANALYSIS_MODULES, RUN_SETTINGS, SETTINGS, EvalContext, SharedPasses
from outlierlab.evaluation.settings import EncoderSettings, section_settings

#: = outlierlab.analysis.transforms.TRANSFORMS (restated here so a typo fails before torch loads; a test keeps them equal)
TRANSFORMS = ("none", "clip", "whiten", "standardize", "abtt", "center")
#: The transforms fitted on data; their CSV rows carry ``<name>_fit``, ``<name>_n``, ... columns.
FITTED = TRANSFORMS[2:]


# ----------------------------------------------------------------------------------- light validation
def analysis_module(name: str) -> str:
    """The module of analysis ``name``: a built-in's (:data:`ANALYSIS_MODULES`), or ``name`` itself when it is a
    dotted module path (an analysis of one's own, :mod:`outlierlab.evaluation.registry`)."""
    return ANALYSIS_MODULES.get(name, name)


def selected_analyses(cfg, given: Mapping[str, Any] | None = None) -> list[str]:
    """``analyses=[...]`` checked against the registry, the import path and the analysis objects ``given`` by a
    Python caller (no torch import)."""
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


def selected_transforms(cfg) -> list[str]:
    use = (cfg.get("transform") or {}).get("use") or {}
    names = [n for n in TRANSFORMS if use.get(n)]
    bad = [n for n, on in use.items() if on and n not in TRANSFORMS]
    if bad or not names:
        raise ValueError(f"unknown or no transform {bad}; valid: transform=[{','.join(TRANSFORMS)}] (any subset)")
    return names


def check_settings(cfg, analyses: list[str]) -> None:
    """Every config section the run reads, built as its typed settings (:mod:`outlierlab.evaluation.settings`, no torch):
    an unknown or missing key, a wrong type or a value out of range fails here in one line."""
    for cls in dict.fromkeys([*RUN_SETTINGS, *(SETTINGS[n] for n in analyses if n in SETTINGS)]):
        section_settings(cls, cfg)


def check_files(cfg) -> list[str]:
    """Every data file the user gave is usable (outlierlab.datamodules.validation), before the model loads; returns
    warnings about valid-but-weak input (printed, and kept in the report)."""
    return validate_inputs(cfg, "evaluate")


# ----------------------------------------------------------------------------------------- the job
def evaluate(cfg: DictConfig, run_dir: str | Path, encoder=None, given: Mapping[str, Any] | None = None) -> dict:
    """Run every selected analysis on one frozen encoder and write the outputs into ``run_dir``.

    ``encoder``: an already loaded :class:`~outlierlab.models.loading.FrozenEncoder` (the Python API,
    :func:`outlierlab.api.evaluate`) instead of the one ``cfg.encoder`` names; the numbers are the same.
    ``given``: analyses as objects (a module or anything with its ``run``/``consumers``, e.g. defined in a
    notebook), by the name ``cfg.analyses`` selects them with."""
    given = dict(given or {})
    analyses, transforms = selected_analyses(cfg, given), selected_transforms(cfg)
    check_settings(cfg, analyses)
    check_files(cfg)
    plots = cfg.get("plots", True)
    if not isinstance(plots, bool):
        raise ValueError(f"plots={plots!r}: expected true (PNG figures) or false (CSVs, report and JSON only)")
    t_start = time.time()
    # lazy: torch and the models load only after every setting and file above was checked (fails in a second)
    import torch

    from outlierlab.models.loading import FrozenEncoder
    from outlierlab.reports.evaluation_report import write_outputs

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(int(cfg.seed))
    if encoder is None:
        encoder = FrozenEncoder.from_config(section_settings(EncoderSettings, cfg))  # + dtype, device_map, revision
    modules = {name: given[name] if name in given else importlib.import_module(analysis_module(name))
               for name in analyses}
    if any(getattr(m, "LM_HEAD", False) for m in modules.values()):
        encoder.lm_head = True  # before the weights load: one copy, head included
    tb = None
    if cfg.tensorboard:
        from torch.utils.tensorboard import SummaryWriter  # lazy: only when tensorboard is on

        tb = SummaryWriter(str(run_dir / "tensorboard"))
    shared = SharedPasses()  # the sentence pass and the MLM model, computed once for every analysis
    contexts = {}
    for name in analyses:
        section = cfg.get(name.rsplit(".", 1)[-1])
        contexts[name] = EvalContext(encoder, section or OmegaConf.create({}), cfg, transforms, run_dir,
                                     int(cfg.seed), tb, shared, plots=plots)
    for name in analyses:  # data problems (missing file, offline hub name) fail before any encoding
        if hasattr(modules[name], "check"):  # its data (WiC pairs, STS sets) is handed to its run()
            contexts[name].prepared = modules[name].check(contexts[name])
        if hasattr(modules[name], "consumers"):  # its subscribers to the shared sentence stream
            contexts[name].consumers = list(modules[name].consumers(contexts[name]))
            shared.consumers += contexts[name].consumers
    if shared.consumers:  # the shared pass feeds them, whichever analysis would have started it
        from outlierlab.evaluation.streaming import sentence_stats

        sentence_stats(next(contexts[n] for n in analyses if contexts[n].consumers))
    results = []
    for i, name in enumerate(analyses):
        t0 = time.time()
        res = modules[name].run(contexts[name])
        res.summary["seconds"] = round(time.time() - t0, 2)
        _fit_columns(res, shared)
        results.append(res)
        why = f" (skipped: {res.summary['skipped']})" if res.summary.get("skipped") else ""
        print(f"[evaluate] {name}: {len(res.rows)} rows in {time.time() - t0:.1f} s{why}", flush=True)
        if shared.sentence_stats is not None and not _reads_sentence_maps(analyses[i + 1:], cfg):
            shared.sentence_stats.release_layer_state()  # its [L, d, d] maps, before WiC/STS fit theirs
    meta = _meta(cfg, encoder, analyses, transforms, shared, time.time() - t_start)
    # the transforms are compared only where some table has a transform column (not in the ablation, order use...)
    meta["transformed"] = any("transform" in r for res in results for r in res.rows)
    # a module's COLUMNS fixes its CSV header, so a skipped analysis (STS without data) still writes one
    columns = {n: getattr(modules[n], "COLUMNS", None) for n in analyses}
    for res in results:  # a fixed header also gets the fit columns its fitted rows carry (whiten_n, abtt_d, ...)
        cols = columns.get(res.name)
        extra = [k for r in res.rows for k in r if k.startswith(tuple(f"{n}_" for n in FITTED))]
        if cols and extra:
            columns[res.name] = list(cols) + [k for k in dict.fromkeys(extra) if k not in cols]
    paths = write_outputs(run_dir, results, meta, _header(meta), columns, tb)
    if tb is not None:
        tb.close()
    print(f"[evaluate] done in {meta['seconds']:.0f} s -> {run_dir} ({', '.join(sorted(paths))})", flush=True)
    return {"results": results, "meta": meta, "files": paths}


#: Analyses whose fitted rows use the maps fitted in the shared pass over the evaluation sentences.
SENTENCE_PASS = ("outliers", "anisotropy", "isotropy", "self_similarity")


def _reads_sentence_maps(analyses, cfg) -> bool:
    """Whether any of ``analyses`` reads the shared pass's fitted maps, Σ or anisotropy reservoir."""
    return any(n in SENTENCE_PASS for n in analyses) or (
        str(cfg.transform.fit_on) == "sentences" and any(n in ("wic", "sts") for n in analyses))


def _fit_columns(res, shared) -> None:
    """Fitted rows (whiten, standardize, abtt, center) of the shared-pass analyses state what their map was
    fitted on (WiC/STS add theirs)."""
    st = shared.sentence_stats
    if res.name not in SENTENCE_PASS or st is None:
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


def _header(meta: dict) -> str:
    lines = [f"# outlierlab evaluation: {meta['encoder']}", "",
             f"- command: `{meta['command']}`",
             f"- encoder: {meta['encoder']} ({meta['encoder_kind']}), {meta['layers']} hidden states "
             f"(layer 0 = embedding output), hidden size {meta['hidden']}, max length {meta['max_length']}, "
             f"device {meta['device']}",
             f"- family: {meta['family']}" + (" Token vectors see only their left context; pooling rules are "
                                              "those of encoders (non-special, non-pad tokens; sentence = mean)."
                                              if "decoder (causal" in meta["family"] else ""),
             f"- analyses: {', '.join(meta['analyses'])}; "
             + (f"transforms side by side: {', '.join(meta['transforms'])}; " if meta.get("transformed", True) else "")
             + f"seed {meta['seed']}; {meta['seconds']:.0f} s in all"]
    fitted = [t for t in meta["transforms"] if t in FITTED] if meta.get("transformed", True) else []
    if fitted:
        label = "/".join({"whiten": "whitening"}.get(t, t) for t in fitted)
        lines.append(f"- **{label} fit (`transform.fit_on={meta['whiten_fit_on']}`)**: outliers/"
                     "anisotropy/isotropy/self-similarity on the evaluation sentences' token vectors; WiC and STS: "
                     + {"eval": "each on its own evaluated data (Su et al. 2021)",
                        "sentences": "the whitener of the evaluation sentences"}.get(
                         meta["whiten_fit_on"], f"the {meta['whiten_fit_on']!r} split of their dataset") +
                     " (details in each section)")
    s = meta.get("sentences")
    if s:
        lines.append(f"- evaluation sentences: {s['n']} from {s['source']}; {s['passes']} streaming pass(es), "
                     f"{s['tokens_encoded']} tokens encoded at {s['tokens_per_s']:.0f} tokens/s")
        lines += [f"- {t}: {info}" for t, info in s["transforms"].items()]
        lines += [f"- note: {n}" for n in s["notes"]]
    return "\n".join(lines)
