"""The ``ln_rule`` config group, read once, for the analyses that disable or correlate LayerNorm outlier dims (ablation,
frequency, attention sinks, outliers).

The rule is ``layernorm_rule.layernorm_outliers`` (Kovaleva et al. 2021; Puccetti et al. 2022) on the norms of
``models.layernorms.model_layernorms``.  ``evaluate.py`` composes ``ln_rule`` at the top level, so ``ln_rule=gain``
changes every analysis at once; ``train.py`` passes the same group to the LayerNorm monitor.
"""

from __future__ import annotations

from collections.abc import Mapping

from omegaconf import OmegaConf
from torch import nn

from outlierlab.metrics.layernorm_rule import (LayerNormOutliers, LayerNormRule, layernorm_kind, layernorm_outliers,
                                                layernorm_role)
from outlierlab.evaluation.registry import EvalContext, check_texts
from outlierlab.configuration.analysis_settings import LAYERNORM_KINDS
from outlierlab.models.layernorms import layernorm_tensors

__all__ = ["ln_rule", "detect_layernorm_outliers", "zeroed_kinds", "check_common"]


def ln_rule(ctx: EvalContext) -> LayerNormRule:
    """The run's ``LayerNormRule`` from the top-level ``ln_rule`` node (absent: the rule's own default,
    as for train.py's monitor)."""
    node = OmegaConf.select(ctx.root_cfg, "ln_rule") if OmegaConf.is_config(ctx.root_cfg) else None
    return LayerNormRule.from_mapping(None if node is None else OmegaConf.to_container(node, resolve=True))


def detect_layernorm_outliers(layernorms: Mapping[str, nn.Module], rule: LayerNormRule) -> LayerNormOutliers:
    """``outlierlab.metrics.layernorm_rule.layernorm_outliers`` on the current weights of ``layernorms``."""
    return layernorm_outliers(layernorm_tensors(layernorms), rule)


def zeroed_kinds(settings, rule: LayerNormRule, layernorms: Mapping[str, nn.Module] | None = None) -> list[str]:
    """Where dims are disabled: ``<section>.layernorms`` if set, else the norms the rule judged (frequency has no such
    key: the rule's norms are checked).

    In a pre-LN model (``layernorms`` holding a ``final`` norm) the default adds ``final``: a pre-LN block never
    normalises the stream it writes, so Kovaleva et al.'s intervention needs every norm reading it — both per-layer
    norms and the final norm before the LM head (docs/fidelity.md).
    """
    kinds = getattr(settings, "layernorms", None)
    if kinds is not None:
        return [str(k) for k in kinds]
    out = [str(k) for k in rule.layernorms]
    pre = layernorms is not None and any(layernorm_role(k) != layernorm_kind(k) for k in layernorms)
    if pre and "final" in layernorms and "final" not in out and "output" in out:
        out.append("final")
    return out


def check_common(ctx: EvalContext, settings) -> LayerNormRule:
    """Validate ``ln_rule``, the LayerNorms ``settings`` (an analysis' typed settings with ``layernorms``,
    ``files``) disables dims in, and its text files, before any model is loaded."""
    rule = ln_rule(ctx)
    kinds = zeroed_kinds(settings, rule)
    if not kinds or set(kinds) - set(LAYERNORM_KINDS):
        raise ValueError(f"{settings.SECTION}.layernorms={kinds}: choose from {sorted(LAYERNORM_KINDS)}")
    check_texts(settings)
    return rule
