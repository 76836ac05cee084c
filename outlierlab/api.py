"""The Python API: what ``evaluate.py`` and ``probe.py`` compute, from a notebook, without a command line.

    import outlierlab as ol
    enc = ol.load_encoder("sentence-transformers/all-MiniLM-L6-v2")      # a run dir, a model dir, a hub id,
                                                                         # or a model in memory (with tokenizer=)
    tables = ol.evaluate(enc, texts, analyses=["outliers", "anisotropy"], transforms=["none", "clip", "whiten"])
    tables["anisotropy"]              # a DataFrame: the rows evaluate.py writes to anisotropy.csv
    ol.probe_positions(enc, texts)    # a DataFrame: probe.py's position_probe.csv

Each call composes the configuration the command line would (the arguments as overrides), runs the same computation
in memory, and writes nothing unless given ``out_dir``, where it writes what the command line writes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outlierlab.monitoring import arguments

__all__ = ["load_encoder", "evaluate", "probe_positions", "dim_identity", "DEFAULT_ANALYSES"]

#: evaluate.py's default analyses (configs/evaluate.yaml).
DEFAULT_ANALYSES = ("outliers", "anisotropy", "isotropy", "self_similarity", "wic", "sts")


def load_encoder(name_or_path: Any, dtype: str = "float32", device: str = "auto", max_length: int | None = None,
                 tokenizer: Any = None, **kwargs: Any):
    """A frozen encoder or decoder (``outlierlab.models.loading.FrozenEncoder``) from a ``train.py`` run directory, a
    saved model directory or a Hugging Face hub id (offline: a cached one), or a model in memory: a ``transformers``
    model with its ``tokenizer=``, or a ``SentenceTransformer``.  A model in memory is used as it is (no copy, its own
    device and dtype: naming another is refused), in eval mode, read live.  ``dtype``: ``float32``, ``bfloat16``,
    ``float16`` or ``auto`` (the checkpoint's); ``kwargs``: ``device_map``, ``revision``, ``batch_size``,
    ``on_overflow``, ``offload_folder``."""
    from outlierlab.models.loading import FrozenEncoder

    _check_load_arguments(device, kwargs)
    if isinstance(name_or_path, (str, os.PathLike)):
        if tokenizer is not None:
            raise TypeError("tokenizer= goes with a model in memory: a run directory, model directory or hub id "
                            "brings its own tokenizer")
        return FrozenEncoder(str(name_or_path), max_length=max_length, device=device, dtype=dtype, **kwargs)
    loading_only = sorted(set(kwargs) - {"batch_size", "on_overflow"})
    if loading_only:
        raise TypeError(f"{', '.join(loading_only)} apply to a model that is loaded; a model in memory is used where "
                        "it is (move or shard it yourself first)")
    body, tokenizer = _in_memory(name_or_path, tokenizer)
    _check_placement(body, device, dtype)
    return FrozenEncoder.from_model(body, tokenizer, max_length=max_length, **kwargs)


#: What ``load_encoder(**kwargs)`` passes on to the loader.
LOAD_KWARGS = ("device_map", "revision", "batch_size", "on_overflow", "offload_folder")


def _check_load_arguments(device: Any, kwargs: dict) -> None:
    """Refuse an unknown keyword, an unknown device or a bad batch size in one line, before anything loads."""
    unknown = sorted(set(kwargs) - set(LOAD_KWARGS))
    if unknown:
        raise TypeError(f"load_encoder got unknown argument(s) {', '.join(unknown)}; valid: name_or_path, dtype, "
                        f"device, max_length, tokenizer, {', '.join(LOAD_KWARGS)}")
    if device != "auto":
        import torch

        try:
            torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device={device!r} is not a device: pass 'auto', 'cpu', 'cuda', 'cuda:1', 'mps', "
                             "...") from None
    arguments.count("batch_size", kwargs.get("batch_size", 1), 1)


def _check_placement(model: Any, device: str, dtype: str) -> None:
    """Refuse (rather than ignore) a ``device=`` or ``dtype=`` other than a model in memory's own."""
    import torch

    from outlierlab.models.placement import DTYPES

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    first = next(iter(model.parameters()), None)
    if first is None:
        return
    if device != "auto":
        want = torch.device(device)
        if want.type != first.device.type or (want.index is not None and want != first.device):
            raise TypeError(f"device={device!r}: the model in memory is on {first.device} and is used where it is; "
                            f"move it first (model.to({device!r}))")
    # float32 is also the default, so only another dtype says the caller expected a conversion
    if dtype not in ("auto", "float32") and first.dtype != getattr(torch, dtype):
        raise TypeError(f"dtype={dtype!r}: the model in memory is in {str(first.dtype).removeprefix('torch.')} and "
                        f"is used as it is; convert it first (model.to(torch.{dtype}))")


def _in_memory(model: Any, tokenizer: Any) -> tuple[Any, Any]:
    """The transformers module inside ``model`` (wrappers looked through) and its tokenizer."""
    from outlierlab.monitoring.loop_monitor import unwrap_model

    if callable(getattr(model, "get_base_model", None)):  # a PeftModel: its adapters are modules of the base
        raise TypeError(f"{type(model).__name__} has adapters in its layers: pass model.merge_and_unload() (it changes "
                        "the model in place: merge a copy to go on training), with tokenizer=")
    body = unwrap_model(model)  # DDP / torch.compile wrappers, a SentenceTransformer's Hugging Face body
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)  # a SentenceTransformer's
    if getattr(body, "config", None) is None or not callable(getattr(body, "save_pretrained", None)):
        raise TypeError(f"cannot load a {type(model).__name__} from memory: pass a transformers model (with "
                        "tokenizer=), a SentenceTransformer, or the directory it was saved to (a train.py run "
                        "directory for a model of ours)")
    if isinstance(tokenizer, (str, os.PathLike)):  # a name, not the tokenizer: refused as the monitors refuse it
        arguments.tokenizer(tokenizer)
    if not callable(getattr(tokenizer, "save_pretrained", None)):
        raise TypeError(f"pass tokenizer= (the {type(body).__name__}'s own Hugging Face tokenizer) with a model in "
                        "memory")
    return body, tokenizer


def _compose(config_name: str, overrides: Sequence[str], sections: dict | None = None):
    from outlierlab.configuration.overrides import CONFIG_DIR

    if not (CONFIG_DIR / f"{config_name}.yaml").is_file():
        raise FileNotFoundError(f"{CONFIG_DIR / (config_name + '.yaml')} not found: the API reads the project's "
                                "configs/, which its wheel carries; reinstall outlierlab from its repository "
                                "(pip install . or pip install -e .)")
    from outlierlab.configuration.composing import compose_config  # after the check: imports Hydra

    cfg = compose_config(config_name, overrides)
    for section, values in (sections or {}).items():  # whole sections, after the presets: what the caller built
        cfg[section] = values
    return cfg


def _names(value: Any, what: str, strings: bool = True) -> list[Any]:
    """``value`` as a list; a bare string, a non-iterable and (with ``strings``) a non-string item are refused."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what}={value!r} is a single string: pass a list, e.g. {what}=[{value!r}]")
    try:
        items = list(value)
    except TypeError:
        example = {"analyses": "['outliers']", "transforms": "['none']"}.get(what, "['outliers.k=2.5']")
        raise TypeError(f"{what}={value!r}: pass a list, e.g. {what}={example}") from None
    bad = [f"[{i}] {x!r}" for i, x in enumerate(items) if not isinstance(x, str)]
    if strings and bad:
        raise TypeError(f"{what} must be a list of strings; not a string: {arguments.listing(bad)}")
    return items


def _out_dir(out_dir: Any) -> Path | None:
    """``out_dir`` as a Path; not a path or an existing file is refused."""
    if out_dir is None:
        return None
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir={out_dir!r}: pass a directory path (str or pathlib.Path), or None to write nothing")
    return Path(arguments.directory("out_dir", out_dir))


def _check_encoder(encoder: Any) -> None:
    """Refuse anything but what ``load_encoder`` returns."""
    from outlierlab.models.loading import FrozenEncoder

    if isinstance(encoder, FrozenEncoder):
        return
    if isinstance(encoder, (str, os.PathLike)):
        raise TypeError(f"encoder={str(encoder)!r} is a name: pass the loaded encoder, "
                        f"ol.load_encoder({str(encoder)!r})")
    raise TypeError(f"encoder is a {type(encoder).__name__}: pass the encoder ol.load_encoder(...) returns (a model "
                    "in memory: ol.load_encoder(model, tokenizer=tokenizer))")


#: ``encoder.*`` keys that say how an encoder is loaded, refused as overrides (the encoder is given, loaded).
_LOADING_KEYS = ("name_or_path", "max_length", "on_overflow", "device", "dtype", "device_map", "revision")


def _check_overrides(overrides: list[str]) -> None:
    """Each override is ``key=value`` (or ``~key``) and sets nothing of how the (given) encoder loads."""
    for override in overrides:
        if "=" not in override and not override.startswith("~"):
            raise ValueError(f"overrides={override!r}: expected key=value, e.g. 'outliers.k=2.5'")
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("encoder.") and key.split(".", 1)[1] in _LOADING_KEYS:
            argument = key.split(".", 1)[1]
            where = (f"pass {argument}= to ol.load_encoder" if argument in ("max_length", "device", "dtype",
                                                                            *LOAD_KWARGS) else
                     "load that encoder with ol.load_encoder")
            raise ValueError(f"overrides={override!r}: the encoder (the first argument) is loaded already; {where}")


def check_texts(texts: Any) -> list[str] | None:
    """``texts`` checked (``arguments.texts``) with whitespace runs folded to one space, or None (the shipped ones)."""
    texts = arguments.texts("texts", texts)
    return None if texts is None else [" ".join(t.split()) for t in texts]


def _check_arguments(overrides: list[str], arguments: Sequence[str]) -> None:
    """Refuse an override of what an argument sets: composed after it, it would replace it silently."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in arguments:
            argument = "transforms" if key == "transform" else key
            raise ValueError(f"overrides={override!r} sets what the argument {argument}= sets: pass it there")


def _check_choices(overrides: list[str], config_name: str) -> None:
    """Refuse an unknown group choice or key in one line, as evaluate.py and probe.py do."""
    from outlierlab.configuration.overrides import find_override_errors, find_key_errors

    errors = find_override_errors(overrides)
    if not errors:  # the keys depend on the group choices: a wrong choice first
        errors = find_key_errors(overrides, config_name)
    if errors:
        raise ValueError("; ".join(errors))


def _encoder_overrides(encoder) -> list[str]:
    return [f"encoder.name_or_path={encoder.source.name}"]  # what the run's config records


def evaluate(encoder, texts: Sequence[str] | None = None, analyses: Sequence[Any] = DEFAULT_ANALYSES,
             transforms: Sequence[str] = ("none", "clip", "whiten"), seed: int = 0, out_dir: str | Path | None = None,
             overrides: Sequence[str] = (), plots: bool = False, progress: bool = True,
             settings: Sequence[Any] | None = None) -> dict[str, Any]:
    """Run evaluate.py's analyses on ``encoder`` (from ``load_encoder``), in memory: one pandas DataFrame per
    analysis (the rows of its ``<analysis>.csv``) and per side table (docs/tables.md).  Nothing is written unless
    ``out_dir`` is given.  A skipped analysis (no LM head, no STS data) is an empty table whose ``attrs["skipped"]``
    says why.  A bad argument (a bare string for a list, an empty text, an unknown name) is refused in one line.

    Parameters
    ----------
    texts
        the sentences of every analysis without texts of its own: a list of strings (or a pandas Series,
        ``df["text"]``); None: the shipped held-out sentences (as ``python evaluate.py``).
    analyses
        a list, as ``analyses=[...]`` on the command line (valid names below), or an object (module, class,
        ``types.SimpleNamespace``) with ``run(ctx)`` and optional ``consumers(ctx)``
        (``outlierlab.evaluation.registry``), named by its ``NAME`` or ``__name__``.
    transforms
        a list, as ``transform=[...]`` on the command line (valid names below), compared side by side.
    out_dir
        also write there everything evaluate.py writes (CSVs, report.md, results.json, figures); named in each
        table's ``attrs["run_dir"]``.
    overrides
        any other command-line override, e.g. ``["wic=superglue", "transform.dims=[588]"]`` (one of what
        an argument sets, ``transform=``, ``analyses=``, ``seed=``, is refused).
    settings
        typed sections, each replacing its whole section, e.g. ``[OutliersSettings(threshold=0.3)]`` (the frozen
        classes of ``outlierlab.configuration``); an override of a key of a section given here is refused.
    plots
        PNG figures, with ``out_dir`` (off by default: a notebook draws its own from the tables).
    """
    from outlierlab.configuration.run_settings import EncoderSettings, TransformSettings
    from outlierlab.configuration.settings_store import given_sections
    from outlierlab.evaluation.core import analysis_name, given_analyses, run_analyses, selected_analyses
    from outlierlab.evaluation.registry import RUN_SETTINGS, SETTINGS

    texts, seed = check_texts(texts), arguments.count("seed", seed, None)
    analyses = _names(analyses, "analyses", strings=False)  # an analysis may be an object
    transforms, overrides = _names(transforms, "transforms"), _names(overrides, "overrides")
    plots, progress = arguments.flag("plots", plots), arguments.flag("progress", progress)
    out_dir = _out_dir(out_dir)
    _check_overrides(overrides)
    _check_arguments(overrides, ("analyses", "transform", "seed", "plots", "progress"))
    given = given_analyses(analyses)
    names = [a if isinstance(a, str) else analysis_name(a) for a in analyses]
    selected_analyses({"analyses": names}, given)  # an unknown name: one line, before anything is composed
    if plots and out_dir is None:
        raise ValueError("plots=True draws PNG files: give out_dir= (where they go), or read the tables")
    choices = [f"transform=[{','.join(transforms)}]", *overrides]
    _check_choices(choices, "evaluate")
    # the sections ol.evaluate(settings=[...]) takes: all but the encoder's and the transforms'
    takes = [c for c in dict.fromkeys([*RUN_SETTINGS, *SETTINGS.values()]) if c not in (EncoderSettings, TransformSettings)]
    sections = given_sections(settings, takes, overrides)
    _check_encoder(encoder)  # last: the checks above never touch it (a test stands an object there that fails)
    cfg = _compose("evaluate", [f"analyses=[{','.join(names)}]", f"seed={seed}",
                                f"plots={str(bool(plots)).lower()}", "tensorboard=false",
                                f"progress={str(bool(progress)).lower()}", *_encoder_overrides(encoder), *choices],
                   sections)
    from outlierlab.metrics.whitening import DegenerateWhiteningError

    try:
        if out_dir is None:
            return run_analyses(cfg, encoder, given, texts).tables()
        from outlierlab.evaluation.run_writer import evaluate as write_evaluation

        tables = write_evaluation(cfg, out_dir, encoder=encoder, given=given, texts=texts)["evaluation"].tables()
    except DegenerateWhiteningError as e:
        raise _in_python(e, "ol.evaluate") from None
    for table in tables.values():
        table.attrs["run_dir"] = str(out_dir)
    return tables


def _in_python(e, call: str):
    """A degenerate fit's error worded as the call's arguments, with how many texts like these the fit needs."""
    import math

    from outlierlab.metrics.whitening import DegenerateWhiteningError

    what = {"whiten": "keep fewer dims with", "abtt": "remove fewer directions with"}
    fixes = [f'{what.get(e.method, "set")} {call}(..., overrides=["{fix}"])' for fix in e.fixes]
    if e.texts and e.found:  # fitted on the caller's sentences: more of them is the first fix
        need = f"it needs {e.need} distinct {e.unit}, about {math.ceil(e.need * e.texts / e.found)} sentences like these"
        fixes.insert(0, "pass more texts")
    else:  # fitted on a data set's own pairs: the caller's sentences are the larger fit
        need = f"it needs {e.need} distinct {e.unit}" if e.need else ""
        fixes.insert(0, 'fit on the evaluation sentences with overrides=["transform.fit_on=sentences"]')
    fixes += [f'leave "{e.method}" out of transforms=',
              'keep the result marked degenerate with overrides=["transform.allow_degenerate=true"]']
    return DegenerateWhiteningError(f"{e.problem}; {need + ': ' if need else ''}{', or '.join(fixes)}",
                                    problem=e.problem, need=e.need, found=e.found, unit=e.unit, fixes=e.fixes,
                                    method=e.method)


def probe_positions(encoder, texts: Sequence[str] | None = None, transforms: Sequence[str] = ("none",), seed: int = 0,
                    out_dir: str | Path | None = None, overrides: Sequence[str] = (), progress: bool = True,
                    tables: bool = False, settings: Sequence[Any] | None = None):
    """probe.py's position probe (Luo et al. 2021 §3) on ``encoder``, in memory: a DataFrame, the rows of
    ``position_probe.csv`` (one per layer x transform: accuracy, mean absolute position error, the top neurons by
    contribution).  Nothing is written unless ``out_dir`` is given: then everything probe.py writes goes there, named
    in each table's ``attrs["run_dir"]``.  ``overrides=["features.cache_dir=<dir>"]`` caches the features.

    The accuracy is the position a layer carries, not one the model uses: a learned table's rows are decodable
    (1.000 at every layer) in a model whose order use is 0.003 nats (docs/order_use.md, "Position probes").  So the
    probe also runs evaluate.py's ``order_use`` on the first 200 texts (``overrides=["probe.order_use=false"]``
    skips it).

    ``tables=True`` returns every table of the run, a dict named by probe.py's CSV files: ``position_probe``,
    ``position_probe_by_position``, ``similarity_by_distance``, ``order_use`` and ``order_use_layers``.  An empty cell
    is NaN; the dim columns (``top_neurons``, ``outlier_dims``, ...) hold ";"-separated strings (``"308;381"``).
    ``settings``: typed sections as in ``evaluate``, ``[ol.ProbeSettings(epochs=2), ol.OutliersSettings(...)]``."""
    from outlierlab.evaluation.probing import probe, run

    texts, seed = check_texts(texts), arguments.count("seed", seed, None)
    choices = [f"transform=[{','.join(_names(transforms, 'transforms'))}]", *_names(overrides, "overrides")]
    progress, tables = arguments.flag("progress", progress), arguments.flag("tables", tables)
    out_dir = _out_dir(out_dir)
    _check_overrides(choices[1:])
    _check_arguments(choices[1:], ("transform", "seed", "progress"))
    task = next((o for o in choices[1:] if o.split("=", 1)[0].lstrip("+~") == "task"), None)
    if task is not None:  # another task trains a sentence classifier: no position_probe table to return
        raise ValueError(f"overrides={task!r}: probe_positions runs the position task; run a sentence classifier "
                         "with `python probe.py task=sst2` (configs/task/)")
    _check_choices(choices, "probe")
    from outlierlab.configuration.analysis_settings import OutliersSettings
    from outlierlab.configuration.probe_settings import ProbeSettings
    from outlierlab.configuration.settings_store import given_sections

    sections = given_sections(settings, [ProbeSettings, OutliersSettings], choices[1:])
    _check_encoder(encoder)
    cfg = _compose("probe", ["task=position", f"seed={seed}", f"progress={str(bool(progress)).lower()}",
                             "features.cache_dir=null", *_encoder_overrides(encoder), *choices], sections)
    from outlierlab.metrics.whitening import DegenerateWhiteningError

    try:
        frames = (probe(cfg, encoder, texts) if out_dir is None else run(cfg, out_dir, encoder, texts)["result"]).frames()
    except DegenerateWhiteningError as e:
        raise _in_python(e, "ol.probe_positions") from None
    if out_dir is not None:
        for frame in frames.values():
            frame.attrs["run_dir"] = str(out_dir)
    return frames if tables else frames["position_probe"]


def dim_identity(history: Any, statistic: str = "abs_argmax_share"):
    """Which dimension carries each layer's concentration, since when, in how many layers (Kovaleva et al. 2021):
    ``outlierlab.metrics.layer_identity.layer_identity`` of a monitor history (a DataFrame, a ``hidden_states.csv``
    or the directory holding it), a row per layer."""
    import pandas as pd

    from outlierlab.metrics.layer_identity import HISTORY, layer_identity

    if not isinstance(history, (pd.DataFrame, str, os.PathLike)):
        raise TypeError(f"history is a {type(history).__name__}: pass a DataFrame of a monitor history, a "
                        "hidden_states.csv, or the directory holding one")
    if not isinstance(history, pd.DataFrame):
        from outlierlab.monitoring.history import history_frame
        from outlierlab.studies.table import resolve

        path = resolve(history)  # also a cell of a packed study: docs/order_use/cells.parquet/pos=none,seed=2
        found = [p for p in (path, path / "hidden_states.csv", path / HISTORY) if p.is_file()]
        if not found:
            raise FileNotFoundError(f"no monitor history at {path}: give a hidden_states.csv, a directory holding one "
                                    "(a monitor's out_dir) or a train.py run directory (its monitor/hidden_states.csv)")
        history = history_frame(found[0])  # complete rows only: a live monitor's last line may be torn
    missing = [c for c in ("step", "name", "statistic", "dim", "value") if c not in history.columns]
    if missing:
        raise ValueError(f"history has no column(s) {', '.join(missing)}: a monitor history has the columns step, "
                         "name, statistic, dim, value (hidden_states.csv, or ol.history_frame's)")
    return layer_identity(history, statistic)


def _valid_names_doc() -> str:
    """The valid analyses and transforms, for ``help(ol.evaluate)``."""
    from outlierlab.evaluation.registry import ANALYSIS_MODULES
    from outlierlab.configuration.overrides import group_options

    return (f"\n    Valid analyses: {', '.join(ANALYSIS_MODULES)} (default: {', '.join(DEFAULT_ANALYSES)}), or the "
            f"dotted module path of one's own.\n    Valid transforms: {', '.join(group_options('transform'))}.\n")


evaluate.__doc__ += _valid_names_doc()
