"""Registry of the analyses ``evaluate.py`` runs; one module per analysis registers itself here.

Each analysis is a function ``run(ctx: EvalContext) -> AnalysisResult``. ``evaluate.py`` builds
one :class:`EvalContext` (the frozen encoder, the analysis' own config section, the transforms
to compare, the run directory), calls every selected analysis, and writes ``<name>.csv``
(rows), the Markdown report (sections in order) and the figures.

Kept free of heavy imports: analyses import torch/transformers inside their own modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class EvalContext:
    """What every analysis receives.

    encoder : models.loading.FrozenEncoder (loaded once, shared)
    cfg : the analysis' own config section (omegaconf DictConfig), e.g. ``cfg.wic``
    root_cfg : the whole evaluate config
    transforms : names to compare side by side, subset of ("none", "clip", "whiten")
    out_dir : run directory (write figures here; CSV/MD are written by evaluate.py)
    seed : global seed
    tb : a ``torch.utils.tensorboard.SummaryWriter`` or None
    shared : cache shared between analyses (e.g. encoded features of the default sentences)
    """

    encoder: Any
    cfg: Any
    root_cfg: Any
    transforms: list[str]
    out_dir: Path
    seed: int = 0
    tb: Any = None
    shared: dict[str, Any] = field(default_factory=dict)


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


ANALYSES: dict[str, Callable[[EvalContext], AnalysisResult]] = {}
# Module that defines each analysis, imported lazily by evaluate.py (so a typo fails before torch loads).
ANALYSIS_MODULES: dict[str, str] = {
    "outliers": "evaluation.outliers",
    "anisotropy": "evaluation.anisotropy",
    "self_similarity": "evaluation.self_similarity",
    "wic": "evaluation.wic",
    "sts": "evaluation.sts",
    "ablation": "evaluation.ablation",
    "frequency": "evaluation.frequency",
    "attention_sinks": "evaluation.attention_sinks",
}


def register(name: str):
    def deco(fn: Callable[[EvalContext], AnalysisResult]):
        ANALYSES[name] = fn
        return fn

    return deco
