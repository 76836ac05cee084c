"""Typed settings of the evaluate.py analyses (outlierlab/configuration/run_settings.py and analysis_settings.py): evaluate.py reads the composed
YAML (the dataclasses' Python defaults are kept equal to it by tests/test_settings_defaults.py), load_settings
refuses unknown/missing keys and wrong types in one line, and evaluate.py checks every selected section before
any model is loaded."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import compose
from outlierlab.evaluation.registry import ANALYSIS_MODULES, RUN_SETTINGS, SETTINGS, EvalContext, SharedPasses
from outlierlab.configuration.analysis_settings import AblationSettings, OutliersSettings, WicSettings
from outlierlab.configuration.run_settings import DataSettings, TransformSettings
from outlierlab.configuration.settings_store import load_settings, section_settings

ROOT = Path(__file__).resolve().parent.parent
ALL = list(dict.fromkeys([*RUN_SETTINGS, *SETTINGS.values()]))


def _plain(value):
    """Settings values as the YAML writes them (tuples are lists)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("overrides", [[], ["wic=superglue", "sts=paper", "transform=[none,clip]"],
                                       ["encoder=bert_base_uncased", "transform=[whiten]"]])
def test_settings_from_the_composed_config_equal_the_yaml_values(overrides):
    cfg = compose("evaluate", overrides)
    for cls in ALL:
        settings = section_settings(cls, cfg)
        yaml = OmegaConf.to_container(cfg[cls.SECTION], resolve=True)
        got = {k: _plain(v) for k, v in dataclasses.asdict(settings).items() if k in yaml}
        assert got == yaml, cls.SECTION
        # a key absent from the YAML is one of the genuinely optional ones, and then None
        assert all(getattr(settings, k) is None for k in dataclasses.asdict(settings) if k not in yaml), cls.SECTION


def test_a_yaml_default_change_flows_through_without_code(tmp_path):
    """Set a value in a copy of configs/ (a group preset, evaluate.yaml): the settings evaluate.py builds follow the
    YAML over the dataclasses' defaults it starts from."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    ablation = configs / "ablation" / "default.yaml"
    ablation.write_text(ablation.read_text() + "n_random: 7\n")
    evaluate = configs / "evaluate.yaml"
    evaluate.write_text(evaluate.read_text().replace("\nhydra:\n", "\noutliers:\n  threshold: 0.4\n\nhydra:\n"))
    compose("evaluate")  # registers the resolvers and the defaults
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        cfg = hydra_compose(config_name="evaluate")
    assert section_settings(AblationSettings, cfg).n_random == 7
    assert section_settings(OutliersSettings, cfg).threshold == 0.4


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.SECTION)
def test_unknown_key_names_the_key_and_the_valid_ones(cls):
    node = OmegaConf.create({**OmegaConf.to_container(compose("evaluate")[cls.SECTION]), "treshold": 1})
    valid = [f.name for f in dataclasses.fields(cls)]
    with pytest.raises(ValueError) as e:
        load_settings(cls, node)
    msg = str(e.value)
    assert f"{cls.SECTION}.treshold" in msg and "\n" not in msg
    assert all(name in msg.split("valid keys")[1] for name in valid)


def test_missing_key_is_refused_with_its_name():
    node = OmegaConf.to_container(compose("evaluate").ablation)
    del node["n_random"]
    with pytest.raises(ValueError, match=r"missing key\(s\) ablation\.n_random"):
        load_settings(AblationSettings, node)
    with pytest.raises(ValueError, match=r"missing key\(s\) data\.files, data\.max_sentences, data\.chunk"):
        load_settings(DataSettings, None)


@pytest.mark.parametrize("key, value, match", [
    ("threshold", "high", r"outliers\.threshold='high': expected float, got str"),
    ("top_k", 2.5, r"outliers\.top_k=2\.5: expected int, got float"),
    ("top_k", True, r"outliers\.top_k=True: expected int, got bool"),
    ("method", 3, r"outliers\.method must be 'share' or 'sigma', got 3"),
])
def test_wrong_type_is_refused(key, value, match):
    node = {**OmegaConf.to_container(compose("evaluate").outliers), key: value}
    with pytest.raises(ValueError, match=match):
        load_settings(OutliersSettings, node)


def test_coercions_int_to_float_and_lists_to_tuples():
    cfg = compose("evaluate", ["outliers.threshold=1", "wic.thresholds=[0.5,1]", "ablation.dims=[3,5]",
                               "data.files=a.txt"])
    o = section_settings(OutliersSettings, cfg)
    assert o.threshold == 1.0 and isinstance(o.threshold, float)
    assert section_settings(WicSettings, cfg).thresholds == (0.5, 1.0)
    assert section_settings(AblationSettings, cfg).dims == (3, 5)
    assert section_settings(DataSettings, cfg).files == ("a.txt",)  # one file without brackets
    with pytest.raises(ValueError, match=r"ablation\.dims\[1\]='x': expected int"):
        section_settings(AblationSettings, compose("evaluate", ["ablation.dims=[3,x]"]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.threshold = 0.5


@pytest.mark.parametrize("override, match", [
    ("outliers.threshold=0", r"^outliers\.threshold must be > 0, got 0$"),
    ("outliers.threshold=1.5", r"^outliers\.threshold must be <= 1, got 1\.5$"),
    ("transform.k=0", r"^transform\.k must be >= 1 or null, got 0$"),
    ("encoder.dtype=fp8", r"^encoder\.dtype must be 'auto', 'bfloat16', 'float16' or 'float32', got 'fp8'$"),
    ("data.max_sentences=1", r"data\.max_sentences must be >= 2 or null, got 1"),
    ("ablation.mlm_probability=1", r"ablation\.mlm_probability must be < 1, got 1"),
    ("ablation.layernorms=[ouput]", r"ablation\.layernorms=\['ouput'\]: choose from"),
    ("frequency.counts_from=files", r"frequency\.counts_from=files needs frequency\.count_files"),
    ("wic.report_split=train", r"wic\.report_split='train' equals wic\.split"),
    ("attention_sinks.sink_threshold=0", r"attention_sinks\.sink_threshold must be > 0, got 0"),
])
def test_value_ranges_are_checked_when_the_settings_are_built(override, match):
    cfg = compose("evaluate", [override])
    section = override.split(".")[0]
    cls = next(c for c in ALL if c.SECTION == section)
    with pytest.raises(ValueError, match=match):
        section_settings(cls, cfg)


def test_optional_keys_are_none_when_their_group_is_absent():
    t = section_settings(TransformSettings, compose("evaluate", ["transform=[none]"]))
    assert (t.dims, t.dims_by_layer, t.k, t.abtt_d) == (None,) * 4
    # the guard of every fitted transform is stated once, in evaluate.yaml, whichever groups are selected
    assert (t.min_fit_ratio, t.allow_degenerate) == (2.0, False)


@pytest.mark.parametrize("overrides, match", [
    (["analyses=[outliers]", "outliers.threshold=2"], r"outliers\.threshold must be <= 1"),
    (["analyses=[ablation]", "+ablation.n_randon=3"], r"unknown key\(s\) ablation\.n_randon; valid keys of ablation"),
    (["analyses=[wic]", "wic.max_pairs=many"], r"wic\.max_pairs='many': expected int or null"),
    (["analyses=[outliers]", "seed=abc"], r"^seed='abc': expected an integer"),  # was: invalid literal for int()
    (["analyses=[outliers]", "seed=1.5"], r"^seed=1\.5: expected an integer"),  # was: seed 1, silently
])
def test_evaluate_checks_settings_before_any_model_is_loaded(overrides, match, tmp_path, monkeypatch):
    import outlierlab.models.loading
    from evaluate import evaluate

    def refuse(*args, **kwargs):
        raise AssertionError("the encoder was loaded before the settings were checked")

    monkeypatch.setattr(outlierlab.models.loading, "FrozenEncoder", refuse)
    with pytest.raises(ValueError, match=match):
        evaluate(compose("evaluate", overrides), tmp_path)


def test_shared_work_is_typed_fields_not_string_keys():
    ctx = EvalContext(None, None, None, ["none"], Path("."))
    assert isinstance(ctx.shared, SharedPasses) and ctx.prepared is None
    fields = {f.name for f in dataclasses.fields(SharedPasses)}
    assert fields == {"sentence_stats", "mlm", "consumers", "texts", "needs", "settings"}


def test_what_reads_the_sentence_pass_is_declared_by_each_analysis_not_routed_by_name():
    """The shared pass computes what the selected analyses' SENTENCE_PASS declare and feeds what they subscribe:
    every built-in that reads it declares it, and neither the pass nor the evaluation core names an analysis (or
    a statistic of one) to decide what to compute."""
    import importlib
    import re

    # directly, or through the sentence pass's helpers for the analyses that encode their own texts (WiC, STS)
    readers = re.compile(r"\b(sentence_stats|task_transforms|borrow_fitted_maps)\(")
    reads = {name for name, module in ANALYSIS_MODULES.items()
             if readers.search((ROOT / (module.replace(".", "/") + ".py")).read_text())}
    declares = {name for name, module in ANALYSIS_MODULES.items()
                if hasattr(importlib.import_module(module), "SENTENCE_PASS")}
    assert reads == declares and {"outliers", "anisotropy", "isotropy", "self_similarity", "wic", "sts"} <= reads
    for engine in ("outlierlab/evaluation/sentence_pass.py", "outlierlab/evaluation/core.py"):
        quoted = set(re.findall(r"[\"']([a-z_]+)[\"']", (ROOT / engine).read_text()))
        assert not quoted & set(ANALYSIS_MODULES), engine


def test_every_analysis_that_scores_with_the_lm_head_is_listed():
    """evaluate.py loads the encoder with its LM head (once) for exactly the analyses that call shared_mlm."""
    import importlib

    calls = {name for name, module in ANALYSIS_MODULES.items()
             if "shared_mlm(" in (ROOT / (module.replace(".", "/") + ".py")).read_text()}
    flagged = {name for name, module in ANALYSIS_MODULES.items()
               if getattr(importlib.import_module(module), "LM_HEAD", False)}
    assert flagged == calls and len(calls) == 6  # ablation, attention_sinks, frequency, frequent_tokens, order_use, quantization


def test_no_default_is_restated_at_a_call_site():
    """The helpers that took a fallback default (cfg_get, _get, setting) are gone from the engine and the analyses."""
    pattern = re.compile(r"\b(cfg_get|_get|setting)\(")
    modules = sorted((ROOT / "outlierlab" / "evaluation").rglob("*.py"))  # the analyses are evaluation/analyses/
    assert len([p for p in modules if p.parent.name == "analyses"]) >= 13
    hits = [f"{p.parent.name}/{p.name}:{i}" for p in modules
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


@pytest.mark.parametrize("build, match", [
    (lambda: OutliersSettings(threshold="0.3"), r"^outliers\.threshold='0\.3': expected float, got str$"),
    (lambda: OutliersSettings(top_k=True), r"^outliers\.top_k=True: expected int, got bool$"),
    (lambda: OutliersSettings("sigma", "0.3"), r"^outliers\.threshold='0\.3': expected float, got str$"),  # positional
    (lambda: OutliersSettings(treshold=0.3), r"^unknown key\(s\) outliers\.treshold; valid keys of outliers: method"),
    (lambda: OutliersSettings("share", 0.3, 3.0, 5, 3.0, 9),  # one positional value too many (was an IndexError)
     r"^outliers takes at most 5 positional values \(method, threshold, k, top_k, position_k\), got 6; name them"),
    (lambda: OutliersSettings(threshold=2), r"^outliers\.threshold must be <= 1, got 2$"),
    (lambda: OutliersSettings(method="max"), r"^outliers\.method must be 'share' or 'sigma', got 'max'$"),
    (lambda: DataSettings(max_sentences=1), r"^data\.max_sentences must be >= 2 or null, got 1$"),
    (lambda: AblationSettings(dims=[3, "x"]), r"^ablation\.dims\[1\]='x': expected int, got str$"),
    (lambda: TransformSettings(dims=[1, "x"]), r"^transform\.dims\[1\]='x': expected int, got str$"),
    (lambda: WicSettings(max_pairs="many"), r"^wic\.max_pairs='many': expected int or null, got str$"),
])
def test_settings_built_from_python_are_type_checked_in_one_line(build, match):
    """The classes validate themselves (pydantic, strict), so a notebook's typo fails as the YAML's would."""
    with pytest.raises(ValueError, match=match) as e:
        build()
    assert "\n" not in str(e.value)


def test_python_lists_are_read_as_the_declared_tuples():
    s = AblationSettings(dims=[3, 5], layernorms="output")
    assert s.dims == (3, 5) and s.layernorms == ("output",)
    assert WicSettings(thresholds=[0.5, 1]).thresholds == (0.5, 1.0)
    assert hash(s) == hash(AblationSettings(dims=(3, 5), layernorms=("output",)))  # frozen and hashable: tuples


def test_no_module_imports_a_settings_loader():
    """The classes are their own validator: no separate loader module, and nothing imports one."""
    package = ROOT / "outlierlab"
    assert list(package.rglob("settings_loader*.py")) == []
    tests = [p for p in (ROOT / "tests").glob("*.py") if p.name != Path(__file__).name]
    sources = [*package.rglob("*.py"), *(ROOT / n for n in ("evaluate.py", "probe.py", "train.py")),
               *(ROOT / "benchmarks").glob("*.py"), *tests]
    assert [p.name for p in sources if "settings_loader" in p.read_text()] == []


@pytest.mark.parametrize("analysis", ["frequency", "frequent_tokens"])
def test_a_missing_count_file_fails_in_the_analysis_check_with_its_key(analysis, tmp_path):
    import importlib

    (tmp_path / "counts.txt").write_text("a sentence\n")
    files = f"[{tmp_path / 'counts.txt'},{tmp_path / 'gone.txt'}]"
    cfg = compose("evaluate", [f"{analysis}.counts_from=files", f"{analysis}.count_files={files}"])
    ctx = EvalContext(None, cfg[analysis], cfg, ["none"], tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"^{analysis}\.count_files: file not found: .*gone\.txt$"):
        importlib.import_module(f"outlierlab.evaluation.analyses.{analysis}").check(ctx)
    cfg = compose("evaluate", [f"{analysis}.counts_from=eval", f"{analysis}.count_files={files}"])
    importlib.import_module(f"outlierlab.evaluation.analyses.{analysis}").check(EvalContext(None, cfg[analysis], cfg, ["none"],
                                                                                   tmp_path))  # not read: not checked


def test_every_built_in_reads_its_settings_from_the_context_built_once():
    """The typed sections are built once per run (before any model loads) and every analysis reads them from its
    context, shared: no analysis module rebuilds one from a DictConfig."""
    cfg = compose("evaluate")
    wic = EvalContext(None, cfg.wic, cfg, ["none"], Path("."))
    sts = EvalContext(None, cfg.sts, cfg, ["none"], Path("."), shared=wic.shared)
    assert wic.settings(TransformSettings) is sts.settings(TransformSettings)
    assert wic.settings(WicSettings) == section_settings(WicSettings, cfg)
    sources = {name: (ROOT / (module.replace(".", "/") + ".py")).read_text()
               for name, module in ANALYSIS_MODULES.items()}
    rebuilt = {name for name, src in sources.items() if re.search(r"\b(load_settings|section_settings)\(", src)}
    assert rebuilt == set()
