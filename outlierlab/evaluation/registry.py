"""Which analyses ``evaluate.py`` can run, and what each receives and returns.

An analysis is ONE module with ``run(ctx: EvalContext) -> AnalysisResult`` and, optionally: ``check(ctx)``
(load and validate its data before any encoding, handed to ``run`` as ``ctx.prepared``); ``consumers(ctx)``
(``sentence_stream.Consumer`` s of the shared per-layer stream, read back as ``ctx.consumers``); ``COLUMNS`` (its CSV
header, written even when skipped); ``SENTENCE_PASS`` (``sentence_pass.PASS_NEEDS`` names it asks of the pass's fit,
or a function of ``ctx`` returning them); ``LM_HEAD = True`` (it scores with the LM head, ``shared_mlm``).

Its config section is ``cfg.<name>`` (a module path's last component); a built-in reads it as its ``SETTINGS``
dataclass, checked before any model loads.  Any other importable module is selected by its dotted path
(``analyses=[outliers,mypkg.my_analysis]``).  The built-in modules are imported only once selected, so a typo fails
before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from outlierlab.configuration.analysis_settings import (AblationSettings, AnisotropySettings, AttentionSinksSettings,
                                                        FrequencySettings, FrequentTokensSettings, IsotropySettings,
                                                        OrderUseSettings, OutliersSettings, QKOutliersSettings,
                                                        QuantizationSettings, SelfSimilaritySettings, StsSettings,
                                                        WicSettings)
from outlierlab.configuration.run_settings import DataSettings, EncoderSettings, TransformSettings
from outlierlab.configuration.settings_store import section_settings

if TYPE_CHECKING:  # annotations only: the registry stays free of torch
    from outlierlab.models.lm_model import LoadedModel
    from outlierlab.evaluation.sentence_pass import SentenceStats


S = TypeVar("S")


@dataclass
class SharedPasses:
    """Work done once per ``evaluate.py`` run and shared by the analyses: the one sentence pass
    (``sentence_pass.sentence_stats``; WiC and STS take its clip dims and sentence-fitted whitener), the encoder
    with its LM head (``shared_mlm``), the subscribed consumers (equal ``key``: one), the pass needs, the texts
    given in memory (None: read as configured) and the typed sections, each built once."""

    sentence_stats: SentenceStats | None = None
    mlm: LoadedModel | None = None
    consumers: list = field(default_factory=list)  # every analysis' subscribers to the shared sentence stream
    texts: list[str] | None = None
    needs: set[str] = field(default_factory=set)  # what the selected analyses read from the shared pass
    settings: dict[type, Any] = field(default_factory=dict)  # the typed sections, built once

    def subscribe(self, consumer):
        """``consumer`` subscribed, or the one already subscribed under its ``key`` (shared, fed once)."""
        key = getattr(consumer, "key", None)
        same = next((c for c in self.consumers if key is not None and c.key == key), None)
        if same is None:
            self.consumers.append(consumer)
        return consumer if same is None else same


@dataclass
class EvalContext:
    """What every analysis receives: the shared ``FrozenEncoder``, its own config section ``cfg`` (a built-in
    reads ``ctx.settings(WicSettings)`` instead), the whole config, the transforms compared, ``out_dir`` for
    figures (None: none drawn), what its ``check`` loaded (``prepared``) and its ``consumers(ctx)``, filled before
    ``run``; ``plots=False`` skips the PNGs (a series or sweep of many cells)."""

    encoder: Any
    cfg: Any
    root_cfg: Any
    transforms: list[str]
    out_dir: Path | None
    seed: int = 0
    tb: Any = None
    shared: SharedPasses = field(default_factory=SharedPasses)
    prepared: Any = None
    plots: bool = True
    consumers: list = field(default_factory=list)

    def settings(self, cls: type[S]) -> S:
        """The run's section ``cls.SECTION`` as its typed settings, built once per run and shared."""
        built = self.shared.settings
        if cls not in built:
            built[cls] = section_settings(cls, self.root_cfg)
        return built[cls]


@dataclass
class AnalysisResult:
    """Rows, a ``##`` report section, PNG paths, headline ``summary`` and side tables ``{name: (rows, columns)}``."""

    name: str
    rows: list[dict[str, Any]]
    markdown: str
    figures: list[Path] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, tuple[list[dict[str, Any]], list[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # checked where it is made, not later in the table or report writer
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"AnalysisResult name must be a non-empty string (its table's name), got {self.name!r}")
        if not isinstance(self.rows, (list, tuple)):
            raise TypeError(f"AnalysisResult {self.name!r}: rows must be a list of dicts (column -> value), got a "
                            f"{type(self.rows).__name__}")
        bad = [f"[{i}] {type(r).__name__}" for i, r in enumerate(self.rows) if not isinstance(r, dict)][:8]
        if bad:
            raise TypeError(f"AnalysisResult {self.name!r}: rows must be dicts (column -> value); not a dict: "
                            f"{', '.join(bad)}")
        if not isinstance(self.markdown, str):
            raise TypeError(f"AnalysisResult {self.name!r}: markdown must be a string (its report section, '' for "
                            f"none), got a {type(self.markdown).__name__}")
        self.rows = list(self.rows)
        self.figures = [f for f in self.figures if f is not None]  # a figure not drawn (plots=false)


#: The built-in analyses and the typed settings of each one's config section.
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
    "quantization": QuantizationSettings,
}
#: name -> module of the built-in analyses, imported lazily.
ANALYSIS_MODULES: dict[str, str] = {name: f"outlierlab.evaluation.analyses.{name}" for name in SETTINGS}
#: Sections of the whole run that the shared sentence pass and every analysis may read, whichever are selected.
RUN_SETTINGS: tuple[type, ...] = (EncoderSettings, DataSettings, TransformSettings, OutliersSettings,
                                  AnisotropySettings, SelfSimilaritySettings)


# ------------------------------------------------------------------ what a run gives each analysis
def skip_result(name: str, title: str, reason: str) -> AnalysisResult:
    """A one-line 'skipped' section (no rows) instead of a crash."""
    return AnalysisResult(name, [], f"{title}\n\nSkipped: {reason}\n", summary={"skipped": reason})


def shared_mlm(ctx) -> LoadedModel:
    """``load_mlm`` of ``ctx.encoder``, loaded once per evaluate.py run (kept in ``ctx.shared.mlm``)."""
    if ctx.shared.mlm is None:
        from outlierlab.models.lm_model import load_mlm  # lazy: the registry stays free of torch

        ctx.shared.mlm = load_mlm(ctx.encoder)
    return ctx.shared.mlm


def check_texts(settings) -> None:
    """The analysis' own ``files`` (and ``count_files`` with ``counts_from: files``) exist, before any encoding."""
    files = [("files", f) for f in settings.files or ()]
    if getattr(settings, "counts_from", None) == "files":
        files += [(f"{settings.SECTION}.count_files", f) for f in settings.count_files or ()]
    for key, f in files:
        if not Path(str(f)).expanduser().is_file():
            raise FileNotFoundError(f"{key}: file not found: {f}")


def analysis_texts(ctx, settings) -> tuple[list[str], str]:
    """Held-out texts for an analysis and where they come from: its own ``files``, else the texts given in memory,
    else ``data.files``, else the shipped *Persuasion* sentences (not in our pretraining corpus).  The FIRST
    ``max_sentences`` are used, so two analyses with the same limit see the same texts."""
    from outlierlab.datamodules.corpus import load_texts_from_files  # lazy: the registry stays free of torch
    from outlierlab.datamodules.eval_data import load_sentences
    data = ctx.settings(DataSettings)
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


def scored_texts(ctx, settings, loaded) -> tuple[list[str], str, int, int]:
    """``analysis_texts`` as ``loaded`` scores them: ``settings.max_length`` capped by the model's, the texts packed
    into running text of that many tokens where ``settings.pack``, and the seed of the masking and random draws
    (``settings.seed``; null: the global seed)."""
    texts, what = analysis_texts(ctx, settings)
    max_length = min(settings.max_length, loaded.max_length)
    if getattr(settings, "pack", False):
        from outlierlab.datamodules.scoring_batches import pack_texts  # lazy: the registry stays free of torch

        texts = pack_texts(loaded.tokenizer, texts, max_length)
    return texts, what, max_length, ctx.seed if settings.seed is None else settings.seed
