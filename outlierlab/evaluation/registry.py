"""Which analyses ``evaluate.py`` can run, and what each receives and returns.

An analysis is ONE module with a function ``run(ctx: EvalContext) -> AnalysisResult`` and, optionally:

* ``check(ctx)`` — load and validate its data before any encoding (the result is handed to ``run`` as
  ``ctx.prepared``);
* ``consumers(ctx) -> list[Consumer]`` — subscribe to the shared per-layer stream over the evaluation sentences
  (``outlierlab.evaluation.sentence_stream.Consumer``: raw or transformed token or word vectors, every layer once);
  ``run`` then reads what they accumulated (``ctx.consumers``);
* ``COLUMNS`` — its CSV header (a skipped run still writes one);
* ``SENTENCE_PASS`` — what it asks of the fit between the shared pass's two loops beyond what its consumers need
  (Σ, the fitted maps: ``sentence_stats(ctx).transforms``), a set of
  ``outlierlab.evaluation.sentence_pass.PASS_NEEDS`` names or a function of ``ctx`` returning one;
* ``LM_HEAD = True`` — it scores with the model's LM head (``outlierlab.evaluation.registry.shared_mlm``):
  the encoder is then loaded once, head included.

Its config section is ``cfg.<name>`` (a module path: its last component); the built-in analyses read theirs as
the frozen dataclass of ``SETTINGS``, checked before any model loads.

The built-in analyses are the names of ``SETTINGS``, each the module ``outlierlab.evaluation.analyses.<name>``
(``ANALYSIS_MODULES``); any other importable module is selected by its
dotted path (``analyses=[outliers,mypkg.my_analysis]``) — adding an analysis touches that one module (and its
config file).  Kept free of heavy imports: the built-in modules are imported only once selected, after every
setting was checked (a typo fails before torch loads).
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
    """Work done once per ``evaluate.py`` run and reused by several analyses, each under its own typed
    field (filled on first use by the function named).

    sentence_stats : the one streaming pass over the evaluation sentences
        (``outlierlab.evaluation.sentence_pass.sentence_stats``): its fitted transforms and facts; WiC and
        STS take their detected clip dims and their ``transform.fit_on=sentences`` whitener from it
    mlm : the encoder with its masked-LM head (``outlierlab.evaluation.registry.shared_mlm``), on the
        encoder's own weights: the analyses whose module sets ``LM_HEAD = True``
    consumers : the ``Consumer`` s that analyses subscribed to the sentence
        pass, each once: those with equal ``key`` are one (``subscribe``)
    needs : what the selected analyses ask of the sentence pass's fit (their modules' ``SENTENCE_PASS``,
        ``outlierlab.evaluation.sentence_pass.PASS_NEEDS``)
    texts : the evaluation sentences given in memory (``outlierlab.api.evaluate``), in place of
        ``data.files`` and the shipped ones; None: read as configured
    settings : the run's typed sections by class (``EvalContext.settings``), each built once
    """

    sentence_stats: SentenceStats | None = None
    mlm: LoadedModel | None = None
    consumers: list = field(default_factory=list)  # every analysis' subscribers to the shared sentence stream
    texts: list[str] | None = None
    needs: set[str] = field(default_factory=set)  # what the selected analyses read from the shared pass
    settings: dict[type, Any] = field(default_factory=dict)  # the typed sections, built once

    def subscribe(self, consumer):
        """``consumer`` subscribed to the sentence pass, or the one already subscribed under its ``key``: two
        analyses that need the same statistic (the raw outlier counts, say) share one consumer, fed once."""
        key = getattr(consumer, "key", None)
        same = next((c for c in self.consumers if key is not None and c.key == key), None)
        if same is None:
            self.consumers.append(consumer)
        return consumer if same is None else same


@dataclass
class EvalContext:
    """What every analysis receives.

    encoder : outlierlab.models.loading.FrozenEncoder (loaded once, shared)
    cfg : the analysis' own config section (omegaconf DictConfig), e.g. ``cfg.wic``: what an analysis of one's own
        reads; a built-in reads its typed settings, ``ctx.settings(WicSettings)``
    root_cfg : the whole evaluate config
    transforms : names to compare side by side, subset of outlierlab.metrics.transforms.TRANSFORMS
    out_dir : run directory for figures (None: none drawn, ``plots`` is off); tables are returned, not written
    seed : global seed
    tb : a ``torch.utils.tensorboard.SummaryWriter`` or None
    shared : ``SharedPasses``, the work shared between analyses
    prepared : what the analysis' own ``check`` loaded before any encoding (its data), handed to its ``run``
        (None: ``run`` loads it itself)
    consumers : what the analysis' own ``consumers(ctx)`` subscribed to the shared sentence stream, filled by
        the time its ``run`` is called
    plots : draw the analysis' PNG figures (``plots=false``: CSVs, report and JSON only — a checkpoint series
        or a sweep of many cells, where each cell's 7+ figures cost seconds and nobody opens them)
    """

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
        """The run's section ``cls.SECTION`` as its typed settings (``outlierlab.configuration``), built
        from ``root_cfg`` once per run and shared by every analysis (evaluate.py built each selected one before
        any model loaded)."""
        built = self.shared.settings
        if cls not in built:
            built[cls] = section_settings(cls, self.root_cfg)
        return built[cls]


@dataclass
class AnalysisResult:
    """rows: CSV rows (each with ``layer`` and ``transform`` where meaningful);
    markdown: a report section (starts with a ``##`` heading); figures: PNG paths written;
    summary: a few headline numbers for the console and JSON; tables: side tables, name -> (rows, columns),
    each written as ``<name>.csv`` beside the analysis' own (e.g. ``anisotropy_contributions``)."""

    name: str
    rows: list[dict[str, Any]]
    markdown: str
    figures: list[Path] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, tuple[list[dict[str, Any]], list[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # what an analysis written in a notebook returns, checked where it is made: a wrong part failed later, in
        # the table or report writer, as "'str' object has no attribute 'get'" or "'NoneType' ... 'strip'"
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


#: The built-in analyses and the typed settings of each one's own config section (``configs/<analysis>/`` or
#: evaluate.yaml): the one table a built-in analysis is added to, beside its module and its settings class.
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
#: name -> module of the built-in analyses (``outlierlab.evaluation.analyses.<name>``), imported lazily by evaluate.py, so a
#: typo fails before torch loads.
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
    """The analysis' own files exist (before any encoding): its texts (``settings.files``) and, when it counts token
    frequencies in files (``counts_from: files``), those (``count_files``); its ``max_sentences`` was range-checked
    when the settings were built."""
    files = [("files", f) for f in settings.files or ()]
    if getattr(settings, "counts_from", None) == "files":
        files += [(f"{settings.SECTION}.count_files", f) for f in settings.count_files or ()]
    for key, f in files:
        if not Path(str(f)).expanduser().is_file():
            raise FileNotFoundError(f"{key}: file not found: {f}")


def analysis_texts(ctx, settings) -> tuple[list[str], str]:
    """Held-out texts for an analysis and a short description of where they come from.

    Looked up in order: the analysis' own ``files`` / ``max_sentences`` (``settings``, its typed section),
    then the texts given to the run in memory (``ctx.shared.texts``, all of them: ``outlierlab.api.evaluate``),
    then the evaluate config's ``data.files`` / ``data.max_sentences``; no files -> the shipped *Persuasion*
    sentences (``outlierlab.datamodules.eval_data.load_sentences``; not in our pretraining corpus).  The FIRST
    ``max_sentences`` texts are used, so two analyses with the same limit see the same texts.
    """
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
