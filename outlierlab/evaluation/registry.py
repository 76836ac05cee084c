"""Registry of the analyses ``evaluate.py`` runs; one module per analysis registers itself here.

Each analysis is a function ``run(ctx: EvalContext) -> AnalysisResult`` whose config section is read as the
frozen dataclass :data:`SETTINGS` names.  ``evaluate.py`` builds every selected section's settings (and
:data:`RUN_SETTINGS`) before any model is loaded, then one :class:`EvalContext` per analysis (the frozen
encoder, the analysis' own config section, the transforms to compare, the run directory, the typed
:class:`SharedPasses`), calls every selected analysis, and writes ``<name>.csv`` (rows), the Markdown report
(sections in order) and the figures.

Kept free of heavy imports: analyses import torch/transformers inside their own modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from outlierlab.evaluation.settings import (AblationSettings, AnisotropySettings, AttentionSinksSettings, DataSettings,
                                 EncoderSettings, FrequencySettings, FrequentTokensSettings, IsotropySettings,
                                 OrderUseSettings, OutliersSettings, QKOutliersSettings, SelfSimilaritySettings, StsSettings,
                                 TransformSettings, WicSettings)

if TYPE_CHECKING:  # annotations only: the registry stays free of torch
    from outlierlab.evaluation.mlm_loading import LoadedModel
    from outlierlab.evaluation.streaming import SentenceStats


@dataclass
class SharedPasses:
    """Work done once per ``evaluate.py`` run and reused by several analyses, each under its own typed
    field (filled on first use by the function named).

    sentence_stats : the one streaming pass over the evaluation sentences
        (:func:`outlierlab.evaluation.streaming.sentence_stats`): outliers, anisotropy, self_similarity read it; WiC and
        STS take their detected clip dims and their ``transform.fit_on=sentences`` whitener from it
    mlm : the encoder with its masked-LM head (:func:`outlierlab.evaluation.mlm_loading.shared_mlm`), on the
        encoder's own weights: the analyses of :data:`LM_HEAD_ANALYSES`
    """

    sentence_stats: SentenceStats | None = None
    mlm: LoadedModel | None = None


@dataclass
class EvalContext:
    """What every analysis receives.

    encoder : outlierlab.models.loading.FrozenEncoder (loaded once, shared)
    cfg : the analysis' own config section (omegaconf DictConfig), e.g. ``cfg.wic``; read it through
        :func:`outlierlab.evaluation.settings.load_settings` and the class in :data:`SETTINGS`
    root_cfg : the whole evaluate config
    transforms : names to compare side by side, subset of outlierlab.analysis.transforms.TRANSFORMS
    out_dir : run directory (write figures here; CSV/MD are written by evaluate.py)
    seed : global seed
    tb : a ``torch.utils.tensorboard.SummaryWriter`` or None
    shared : :class:`SharedPasses`, the work shared between analyses
    prepared : what the analysis' own ``check`` loaded before any encoding (its data), handed to its ``run``
        (None: ``run`` loads it itself)
    plots : draw the analysis' PNG figures (``plots=false``: CSVs, report and JSON only — a checkpoint series
        or a sweep of many cells, where each cell's 7+ figures cost seconds and nobody opens them)
    """

    encoder: Any
    cfg: Any
    root_cfg: Any
    transforms: list[str]
    out_dir: Path
    seed: int = 0
    tb: Any = None
    shared: SharedPasses = field(default_factory=SharedPasses)
    prepared: Any = None
    plots: bool = True


@dataclass
class AnalysisResult:
    """rows: CSV rows (each with ``layer`` and ``transform`` where meaningful);
    markdown: a report section (starts with a ``##`` heading); figures: PNG paths written;
    summary: a few headline numbers for the console and JSON."""

    name: str
    rows: list[dict[str, Any]]
    markdown: str
    figures: list[Path] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.figures = [f for f in self.figures if f is not None]  # a figure not drawn (plots=false)


ANALYSES: dict[str, Callable[[EvalContext], AnalysisResult]] = {}
# Module that defines each analysis, imported lazily by evaluate.py (so a typo fails before torch loads).
ANALYSIS_MODULES: dict[str, str] = {
    "outliers": "outlierlab.evaluation.outliers",
    "anisotropy": "outlierlab.evaluation.anisotropy",
    "isotropy": "outlierlab.evaluation.isotropy",
    "self_similarity": "outlierlab.evaluation.self_similarity",
    "wic": "outlierlab.evaluation.wic",
    "sts": "outlierlab.evaluation.sts",
    "ablation": "outlierlab.evaluation.ablation",
    "frequency": "outlierlab.evaluation.frequency",
    "attention_sinks": "outlierlab.evaluation.attention_sinks",
    "frequent_tokens": "outlierlab.evaluation.frequent_tokens",
    "qk_outliers": "outlierlab.evaluation.qk_outliers",
    "order_use": "outlierlab.evaluation.order_use",
}

#: The analyses that score with the model's own LM head (:func:`outlierlab.evaluation.mlm_loading.shared_mlm`):
#: when one is selected, evaluate.py has the encoder load its model with the head, so the weights load once.
LM_HEAD_ANALYSES = ("ablation", "attention_sinks", "frequency", "frequent_tokens", "order_use")

#: The typed settings of each analysis' own config section (``configs/<analysis>/`` or evaluate.yaml).
SETTINGS: dict[str, type] = {
    "outliers": OutliersSettings,
    "anisotropy": AnisotropySettings,
    "isotropy": IsotropySettings,
    "self_similarity": SelfSimilaritySettings,
    "wic": WicSettings,
    "sts": StsSettings,
    "ablation": AblationSettings,
    "frequency": FrequencySettings,
    "attention_sinks": AttentionSinksSettings,
    "frequent_tokens": FrequentTokensSettings,
    "qk_outliers": QKOutliersSettings,
    "order_use": OrderUseSettings,
}
#: Sections of the whole run that the shared sentence pass and every analysis may read, whichever are selected.
RUN_SETTINGS: tuple[type, ...] = (EncoderSettings, DataSettings, TransformSettings, OutliersSettings,
                                  AnisotropySettings, SelfSimilaritySettings)


def register(name: str):
    def deco(fn: Callable[[EvalContext], AnalysisResult]):
        ANALYSES[name] = fn
        return fn

    return deco
