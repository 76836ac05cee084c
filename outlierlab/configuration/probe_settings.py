"""Typed settings of ``probe.py``: the ``probe`` section as one frozen, strictly typed dataclass, and
``check_settings``, which builds it with the other settings the probe reads (``seed``, ``task.batch_size``,
``outliers``).  Every refusal is one ``ValueError`` line naming its key, before any model loads.  The class states
``configs/probe.yaml``'s defaults, so ``ProbeSettings(epochs=2)`` builds from Python.  No heavy imports.
"""

from __future__ import annotations

from typing import ClassVar

from outlierlab.configuration.analysis_settings import OutliersSettings
from outlierlab.configuration.settings_store import load_settings
from outlierlab.configuration.typed_settings import AtLeast1, Floats, Positive, as_int, require, settings_class

__all__ = ["ProbeSettings", "check_settings"]


@settings_class
class ProbeSettings:
    """``probe`` (``configs/probe.yaml``): the linear probes' data split, training and listing.

    Counts are at least 1: Lightning reads ``max_epochs=-1`` as "train forever" and ``0`` as "do not train" (an
    untrained probe's accuracy, reported as a result); a count of 0 positions or neurons leaves nothing to probe."""

    SECTION: ClassVar[str] = "probe"
    #: M (Luo et al.: 300); tokens at positions >= M are dropped and counted
    max_positions: AtLeast1 = 300
    #: the position probe also on <s>/[CLS] (position 0) and </s>/[SEP]
    include_special: bool = True
    #: train/validation/test fractions BY SENTENCE (position probe)
    splits: Floats = (0.8, 0.1, 0.1)
    epochs: AtLeast1 = 10
    #: unless the task sets task.batch_size
    batch_size: AtLeast1 = 128
    lr: Positive = 1e-3
    #: false: bias-free classifier (Luo et al. §4.4); the position probe is always bias-free
    classifier_bias: bool = True
    #: validation accuracy each epoch (TensorBoard) and in the CSV
    validate: bool = True
    #: top neurons by contribution listed per layer
    top_k: AtLeast1 = 5
    #: similarity_by_distance up to this distance; null = 32
    max_distance: AtLeast1 | None = 32
    #: position task: also measure whether the model uses order (evaluate.py's order_use)
    order_use: bool = True

    def __post_init__(self) -> None:
        # split_indices would refuse these only after every text is encoded; train and test need sentences
        require(len(self.splits) == 3 and min(self.splits) >= 0 and self.splits[0] > 0 and self.splits[2] > 0,
               f"probe.splits must be three fractions >= 0 (train, validation, test; train and test > 0), "
               f"got {list(self.splits)}")


def check_settings(cfg) -> ProbeSettings:
    """The ``probe`` section, with ``outliers``, ``seed`` and ``task.batch_size`` checked; one line per refusal."""
    from omegaconf import OmegaConf

    as_int(cfg.seed, "seed")
    task_batch = cfg.task.get("batch_size")
    if task_batch is not None and as_int(task_batch, "task.batch_size") < 1:
        raise ValueError(f"task.batch_size must be >= 1, got {task_batch}")
    # the same rule evaluate.py's outliers section states (method, threshold in (0, 1], k > 0)
    OutliersSettings(**OmegaConf.to_container(cfg.outliers, resolve=True))
    return load_settings(ProbeSettings, cfg.probe)
