"""Helpers shared by the analyses: the ``ln_rule`` config group, read once, for those that disable or correlate
LayerNorm outlier dims (ablation, frequency, attention sinks, outliers); the model with its LM head, loaded once
per run (:func:`shared_mlm`); an analysis' own texts (:func:`analysis_texts`).

The rule itself is :func:`outlierlab.analysis.layernorm_rule.layernorm_outliers` (Kovaleva et al. 2021; Puccetti et
al. 2022); the norms come from :func:`outlierlab.models.layernorms.model_layernorms`.  ``evaluate.py`` composes
``ln_rule`` at the top level (``configs/ln_rule/kovaleva.yaml``), so ``ln_rule=gain`` or
``ln_rule.criterion=either`` changes every analysis at once — and ``train.py`` passes the same group to
the LayerNorm monitor.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from omegaconf import OmegaConf
from torch import nn

from outlierlab.analysis.layernorm_rule import (LayerNormOutliers, LayerNormRule, layernorm_kind, layernorm_outliers,
                                                layernorm_role)
from outlierlab.datamodules.corpus import load_texts_from_files
from outlierlab.datamodules.eval_data import load_sentences
from outlierlab.evaluation.registry import AnalysisResult, EvalContext
from outlierlab.evaluation.settings import LAYERNORM_KINDS, DataSettings, section_settings
from outlierlab.models.layernorms import layernorm_tensors
from outlierlab.models.lm_model import LoadedModel, load_mlm

__all__ = ["skip_result", "ln_rule", "detect_layernorm_outliers", "zeroed_kinds", "check_common", "shared_mlm",
           "check_texts", "analysis_texts"]


def skip_result(name: str, title: str, reason: str) -> AnalysisResult:
    """A one-line 'skipped' section (no rows) instead of a crash."""
    return AnalysisResult(name, [], f"{title}\n\nSkipped: {reason}\n", summary={"skipped": reason})


def ln_rule(ctx: EvalContext) -> LayerNormRule:
    """The run's :class:`LayerNormRule` from the top-level ``ln_rule`` node (absent: the rule's own default,
    as for train.py's monitor)."""
    node = OmegaConf.select(ctx.root_cfg, "ln_rule") if OmegaConf.is_config(ctx.root_cfg) else None
    return LayerNormRule.from_mapping(None if node is None else OmegaConf.to_container(node, resolve=True))


def detect_layernorm_outliers(layernorms: Mapping[str, nn.Module], rule: LayerNormRule) -> LayerNormOutliers:
    """:func:`outlierlab.analysis.layernorm_rule.layernorm_outliers` on the current weights of ``layernorms``."""
    return layernorm_outliers(layernorm_tensors(layernorms), rule)


def zeroed_kinds(settings, rule: LayerNormRule, layernorms: Mapping[str, nn.Module] | None = None) -> list[str]:
    """Where dims are disabled: ``<section>.layernorms`` if set, else the norms the rule judged (frequency
    disables nothing and has no such key: the rule's norms are checked).

    In a pre-LN model (``layernorms`` given and holding a ``final`` norm) the rule's default adds ``final``:
    a pre-LN block never normalises the residual stream it writes, so Kovaleva et al.'s intervention —
    the dim removed wherever a norm hands the stream on — needs every norm that reads it: the two per-layer
    norms before each sublayer and the final norm before the LM head (docs/fidelity.md).
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


def shared_mlm(ctx) -> LoadedModel:
    """:func:`load_mlm` of ``ctx.encoder``, loaded once per evaluate.py run (kept in ``ctx.shared.mlm``)."""
    if ctx.shared.mlm is None:
        ctx.shared.mlm = load_mlm(ctx.encoder)
    return ctx.shared.mlm


def check_texts(settings) -> None:
    """The analysis' own ``files`` (``settings.files``) exist (before any encoding); its ``max_sentences``
    was range-checked when the settings were built."""
    for f in settings.files or ():
        if not Path(str(f)).expanduser().is_file():
            raise FileNotFoundError(f"files: file not found: {f}")


def analysis_texts(ctx, settings) -> tuple[list[str], str]:
    """Held-out texts for an analysis and a short description of where they come from.

    Looked up in order: the analysis' own ``files`` / ``max_sentences`` (``settings``, its typed section),
    then the texts given to the run in memory (``ctx.shared.texts``, all of them: :func:`outlierlab.api.evaluate`),
    then the evaluate config's ``data.files`` / ``data.max_sentences``; no files -> the shipped *Persuasion*
    sentences (:func:`outlierlab.datamodules.eval_data.load_sentences`; not in our pretraining corpus).  The FIRST
    ``max_sentences`` texts are used, so two analyses with the same limit see the same texts.
    """
    data = section_settings(DataSettings, ctx.root_cfg)
    files = settings.files if settings.files is not None else data.files
    given = ctx.shared.texts if settings.files is None else None
    limit = settings.max_sentences if settings.max_sentences is not None or given is not None else data.max_sentences
    if given is not None:
        texts, what = list(given), "the texts given"
    elif files:
        files = list(files)
        texts, what = load_texts_from_files(files), f"{len(files)} file(s): " + ", ".join(map(str, files))
    else:
        texts, what = load_sentences(), "held-out sentences (Austen, Persuasion)"
    if limit is not None:
        texts = texts[:limit]
    if not texts:
        raise ValueError("no evaluation texts: set data.files or max_sentences > 0")
    return texts, f"{len(texts)} texts from {what}"
