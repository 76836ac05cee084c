"""Watch LayerNorm gain/bias outlier dimensions emerge during pretraining (Kovaleva et al. 2021; Puccetti et al. 2022).

A thin Lightning adapter over ``outlierlab.monitoring.layernorm_tracker.LayerNormTracker``, the object the
plain-loop and Hugging Face Trainer monitors drive too.  At step 0 (before any update) it keeps a snapshot of every
LayerNorm's gain and bias, part of the callback's ``state_dict`` and so of every checkpoint: a resumed run measures
divergence from the true initialisation.  At every record (see ``lightning_monitor``) it calls
``outlierlab.metrics.monitor_records.layernorm_records`` (descriptive 3σ statistics, and THE LayerNorm-outlier rule
with the ``ln_rule`` settings, the same call ``evaluate.py`` makes) and writes:

``<out_dir>/layernorm.csv`` (``step,name,statistic,dim,value``; names ``embeddings``,
``layer.{i}.attention_output``, ``layer.{i}.output`` and ``model``; statistics listed in ``layernorm_records``).
Per-dim divergence from init is ``gain(step) - gain(0)`` of the ``gain`` rows, written at image records only.

TensorBoard, with ``<ln>`` a LayerNorm name: scalars ``monitor/layernorm/<ln>/n_gain_outliers``,
``…/n_bias_outliers``, ``…/max_abs_gain_div``, ``…/max_abs_bias_div``, ``…/gain_dim_<j>`` and ``…/bias_dim_<j>``
(j = the ``top_k`` strongest 3σ dims, kept once seen, at most ``3·top_k``), ``monitor/layernorm/n_outlier_dims``;
histograms ``monitor/layernorm/<ln>/gain`` and ``…/bias``; images ``monitor/layernorm/heatmap_gain`` and
``…/heatmap_bias`` (Kovaleva et al. Fig. 3 middle), also saved as ``<out_dir>/layernorm_heatmap_{gain,bias}.png``.

Model-level outliers: by default Kovaleva et al.'s criterion (gain AND bias outside mean ± 3σ of each layer's output
LayerNorm) in more than 3 of 12 layers (Puccetti et al.), scaled (``outlierlab.metrics.layernorm_rule.min_layers_for``).
A model whose norms have no gain/bias, or no bias under the ``both`` criterion, gets a one-line notice and only the
model-level rows, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

from outlierlab.metrics.layernorm_rule import LayerNormRule
from outlierlab.monitoring.layernorm_tracker import LayerNormTracker

from .lightning_monitor import LightningOutlierMonitor


class LayerNormMonitor(LightningOutlierMonitor):
    """LayerNorm gain/bias: 3σ outlier dims, divergence from init, dims shared across layers.

    ``out_dir``, ``every_n_steps``, ``image_every_n_steps``, ``vectors`` (every dim's ``gain``/``bias``):
    ``LightningOutlierMonitor``.  ``rule``: THE LayerNorm-outlier rule (``ln_rule`` config group; None: Kovaleva et
    al.'s default), whose ``k`` also sets the σ of the per-LayerNorm statistics; ``top_k``: flagged dims per
    LayerNorm drawn as TensorBoard scalars, and top-|z| dims written to the CSV whether flagged or not;
    ``histograms``: log gain/bias histograms; ``max_heatmap_rows``: steps kept (evenly thinned) for the heatmap.
    """

    filename = LayerNormTracker.filename

    def __init__(self, out_dir: str | None = None, every_n_steps: int = 50, image_every_n_steps: int = 100,
                 rule: LayerNormRule | Mapping | None = None, top_k: int = 3,
                 vectors: bool = True, histograms: bool = True, max_heatmap_rows: int = 200) -> None:
        super().__init__(out_dir, every_n_steps, image_every_n_steps, vectors)
        self.tracker = LayerNormTracker(rule, top_k, histograms, max_heatmap_rows)

    # -- state (the init snapshot survives resume: it is part of every checkpoint) -----------------------
    def state_dict(self) -> dict[str, Any]:
        return self.tracker.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state_dict)

    # -- LightningOutlierMonitor API --------------------------------------------------------------------
    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule, resumed: bool) -> None:
        for notice in self.tracker.begin(getattr(pl_module, "model", pl_module), resumed):
            rank_zero_warn(notice)

    def after_resume(self, step: int) -> None:
        if self.vectors:
            self.tracker.reload(self.history.path)

    def compute(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, vectors: bool
                ) -> tuple[list, dict]:
        return self.tracker.compute(getattr(pl_module, "model", pl_module), step, vectors)
