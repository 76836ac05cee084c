"""outlierlab: pretrain, monitor, probe and evaluate masked-language-model encoders for outlier dimensions and
positional artefacts (Luo, Kulmizev & Mao 2021; Kovaleva et al. 2021; Puccetti et al. 2022).

One sub-package per role; each imports only the ones below it (tests/test_layout.py checks it; docs/layout.md):

    studies → jobs → evaluation → lightning_modules → monitoring → reports → configuration → datamodules → models
    → metrics → utils

The entry points ``train.py``, ``probe.py`` and ``evaluate.py`` sit in the repository root, beside ``configs/``.
Everything lives under this one name so that installing the project never shadows another package
(``evaluate``, ``utils``, ``models`` are common top-level names).
"""

# The monitors, the Python API, what a notebook analysis subclasses or returns, the typed settings and the named
# sites, loaded on first access: ``import outlierlab`` stays free of torch and transformers.
try:  # the installed distribution's version; a bare source tree (no install) says so instead of guessing
    from importlib.metadata import PackageNotFoundError, version as _version

    __version__ = _version("outlierlab")
except PackageNotFoundError:
    __version__ = "0+unknown"

_LAZY = {"OutlierMonitor": "outlierlab.monitoring.loop_monitor",
         "OutlierMonitorCallback": "outlierlab.monitoring.hf_trainer",
         "load_encoder": "outlierlab.api", "evaluate": "outlierlab.api", "probe_positions": "outlierlab.api",
         "dim_identity": "outlierlab.api", "history_frame": "outlierlab.monitoring.history",
         "study_histories": "outlierlab.studies.table",
         "Consumer": "outlierlab.evaluation.sentence_stream", "LayerStream": "outlierlab.evaluation.sentence_stream",
         "AnalysisResult": "outlierlab.evaluation.registry",
         # the typed sections ol.evaluate(settings=[...]) takes (their defaults are the configuration's)
         "DataSettings": "outlierlab.configuration.run_settings",
         **{name: "outlierlab.configuration.analysis_settings" for name in (
             "OutliersSettings", "AnisotropySettings", "IsotropySettings", "SelfSimilaritySettings", "WicSettings",
             "StsSettings", "AblationSettings", "FrequencySettings", "AttentionSinksSettings", "FrequentTokensSettings",
             "QKOutliersSettings", "OrderUseSettings", "QuantizationSettings")},
         "ProbeSettings": "outlierlab.configuration.probe_settings",
         # named sites (docs/sites.md): every activation by one name, cached, hooked, patched
         "sites": "outlierlab.site_runs", "run_with_cache": "outlierlab.site_runs",
         **{name: "outlierlab.scored_runs" for name in ("run_with_hooks", "patch_sites", "interventions")},
         "load_cache": "outlierlab.models.activation_cache"}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    """The lazy names too (PEP 562): a notebook's tab completion and ``dir(ol)`` list the API."""
    return sorted([*globals(), *_LAZY])
