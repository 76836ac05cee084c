"""Settings shared by the analyses that disable or correlate LayerNorm outlier dims (ablation, frequency,
attention sinks) and by the outliers analysis: the ``ln_rule`` config group, read once, and small helpers.

The rule itself is :func:`analysis.layernorm_rule.layernorm_outliers` (Kovaleva et al. 2021; Puccetti et
al. 2022); the norms come from :func:`models.layernorms.model_layernorms`.  ``evaluate.py`` composes
``ln_rule`` at the top level (``configs/ln_rule/kovaleva.yaml``), so ``ln_rule=gain`` or
``ln_rule.criterion=either`` changes every analysis at once — and ``train.py`` passes the same group to
the LayerNorm monitor.
"""

from __future__ import annotations

from collections.abc import Mapping

from omegaconf import OmegaConf
from torch import nn

from analysis.layernorm_rule import LayerNormOutliers, LayerNormRule, layernorm_outliers
from evaluation.mlm_loading import check_texts
from evaluation.registry import AnalysisResult, EvalContext
from models.layernorms import layernorm_tensors

__all__ = ["cfg_get", "skip_result", "ln_rule", "detect_layernorm_outliers", "zeroed_kinds", "check_common"]


def cfg_get(cfg, key: str, default=None):
    """``cfg.<key>`` (dotted) of a DictConfig or mapping; ``default`` when absent or null."""
    if cfg is None:
        return default
    v = OmegaConf.select(cfg if OmegaConf.is_config(cfg) else OmegaConf.create(dict(cfg)), key, default=None)
    return default if v is None else v


def skip_result(name: str, title: str, reason: str) -> AnalysisResult:
    """A one-line 'skipped' section (no rows) instead of a crash."""
    return AnalysisResult(name, [], f"{title}\n\nSkipped: {reason}\n", summary={"skipped": reason})


def ln_rule(ctx: EvalContext) -> LayerNormRule:
    """The run's :class:`LayerNormRule` from the top-level ``ln_rule`` node (absent: the default rule)."""
    node = cfg_get(ctx.root_cfg, "ln_rule")
    if node is None:
        return LayerNormRule()
    return LayerNormRule.from_mapping(OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node)
                                      else dict(node))


def detect_layernorm_outliers(layernorms: Mapping[str, nn.Module], rule: LayerNormRule) -> LayerNormOutliers:
    """:func:`analysis.layernorm_rule.layernorm_outliers` on the current weights of ``layernorms``."""
    return layernorm_outliers(layernorm_tensors(layernorms), rule)


def zeroed_kinds(ctx: EvalContext, rule: LayerNormRule) -> list[str]:
    """Where dims are disabled: ``<section>.layernorms`` if set, else the norms the rule judged."""
    return [str(k) for k in cfg_get(ctx.cfg, "layernorms", list(rule.layernorms))]


def check_common(ctx: EvalContext, section: str) -> LayerNormRule:
    """Validate ``ln_rule`` and ``<section>.layernorms`` and the text files, before any model is loaded."""
    rule = ln_rule(ctx)
    kinds = zeroed_kinds(ctx, rule)
    valid = {"output", "attention_output", "embeddings", "head", "all"}
    if not kinds or set(kinds) - valid:
        raise ValueError(f"{section}.layernorms={kinds}: choose from {sorted(valid)}")
    check_texts(ctx)
    return rule

