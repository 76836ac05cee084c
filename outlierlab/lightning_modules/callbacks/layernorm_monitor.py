"""Watch LayerNorm gain/bias outlier dimensions emerge during pretraining (Kovaleva et al. 2021; Puccetti et al. 2022).

At step 0 (before any update) the callback keeps a snapshot of every LayerNorm's gain and bias; it is
part of the callback's ``state_dict`` and so of every checkpoint, and a resumed run measures divergence
from the true initialisation.  At every record (see :mod:`.base` for when) it calls
:func:`outlierlab.analysis.monitoring.layernorm_records` — i.e. :func:`outlierlab.analysis.layernorm.layernorm_stats`
(descriptive) and THE LayerNorm-outlier rule :func:`outlierlab.analysis.layernorm_rule.layernorm_outliers` with the
``ln_rule`` settings, the same call ``evaluate.py``'s outliers and ablation analyses make — and writes:

``<out_dir>/layernorm.csv`` (columns ``step,name,statistic,dim,value``; see :mod:`.history`), names
``embeddings``, ``layer.{i}.attention_output``, ``layer.{i}.output`` and ``model``; statistics
``gain_mean gain_std bias_mean bias_std n_gain_outliers n_bias_outliers gain_outlier bias_outlier
top_gain_z top_bias_z max_abs_gain_div max_abs_bias_div rule_outlier gain bias`` and (``model``)
``min_layers n_outlier_dims outlier_dim`` (the rule's model-level dims, value = layers flagging).  Per-dim
divergence from init is ``gain(step) - gain(0)`` of the ``gain`` rows.  The per-dim ``gain``/``bias``
rows are written at image records only (step 0, multiples of ``image_every_n_steps``, the last step),
the other statistics at every record.

TensorBoard (every TensorBoardLogger of the trainer), with ``<ln>`` a LayerNorm name:

- scalars ``monitor/layernorm/<ln>/n_gain_outliers``, ``…/n_bias_outliers``, ``…/max_abs_gain_div``,
  ``…/max_abs_bias_div``, ``…/gain_dim_<j>`` and ``…/bias_dim_<j>`` (value of dim j; j = the ``top_k``
  strongest 3σ dims of that LayerNorm, kept once seen, at most ``3·top_k`` per LayerNorm), and
  ``monitor/layernorm/n_outlier_dims`` (the rule's model-level dims);
- histograms ``monitor/layernorm/<ln>/gain`` and ``monitor/layernorm/<ln>/bias``;
- images ``monitor/layernorm/heatmap_gain`` and ``monitor/layernorm/heatmap_bias`` (per-dim value over
  the recorded steps, Kovaleva et al. Fig. 3 middle; flagged dims marked), also saved as
  ``<out_dir>/layernorm_heatmap_gain.png`` / ``layernorm_heatmap_bias.png``.

Model-level outliers: by default Kovaleva et al.'s criterion (gain AND bias outside mean ± 3σ of each
layer's output LayerNorm) in more than 3 of 12 layers (Puccetti et al.), scaled: ``"4/12"`` rounded up is
2 of 4 layers for the tiny model (:func:`outlierlab.analysis.layernorm_rule.min_layers_for`).  A model whose norms
have no gain/bias (``model.norm=layernorm_noaffine``, no norms at all) or no bias (RMSNorm, under the
``both`` criterion) gets a one-line notice and only the model-level rows, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from outlierlab.analysis.layernorm_rule import LayerNormRule, layernorm_outliers
from outlierlab.analysis.monitoring import layernorm_records, layernorm_snapshot
from outlierlab.models.layernorms import layernorm_tensors, model_layernorms

from outlierlab.reports import monitor_plots as plots
from .base import OutlierMonitor
from outlierlab.reports.history import read_history, vectors_by_step

def layernorm_outliers_notice(layernorms: Mapping[str, nn.Module], rule: LayerNormRule) -> str:
    """One line saying what ``rule`` cannot judge in these norms ('' when it judges every one it selects)."""
    params = layernorm_tensors(layernorms)
    det = layernorm_outliers(params, rule)
    if not params:
        return "the model has no LayerNorm at all (e.g. model.block=op): no LayerNorm outlier dims to track"
    if det.unjudged:
        return (f"{len(det.unjudged)} LayerNorm(s) cannot be judged by the rule — {next(iter(det.unjudged.values()))}"
                + ("; nothing to track" if not det.per_layer else ""))
    return ""


def module_layernorms(pl_module: nn.Module) -> dict[str, nn.Module]:
    """The tracked norms: :func:`outlierlab.models.layernorms.model_layernorms` of ``pl_module.model`` (or the module)."""
    return model_layernorms(getattr(pl_module, "model", pl_module))


class LayerNormMonitor(OutlierMonitor):
    """LayerNorm gain/bias: 3σ outlier dims, divergence from init, dims shared across layers.

    Parameters
    ----------
    out_dir, every_n_steps, image_every_n_steps, vectors
        See :class:`.base.OutlierMonitor` (``vectors``: write every dim's ``gain``/``bias``).
    rule : LayerNormRule or mapping
        THE LayerNorm-outlier rule (``ln_rule`` config group; None: Kovaleva et al.'s default).  Its ``k``
        also sets the σ of the per-LayerNorm gain/bias statistics.
    top_k : int
        Strongest flagged dims per LayerNorm whose values go to TensorBoard scalars, and the number of
        top-|z| dims written to the CSV (``top_gain_z``) whether flagged or not.
    histograms : bool
        Log gain/bias histograms per LayerNorm.
    max_heatmap_rows : int
        Steps kept (evenly thinned) for the heatmap image, bounding memory on long runs.
    """

    filename = "layernorm.csv"

    def __init__(self, out_dir: str | None = None, every_n_steps: int = 50, image_every_n_steps: int = 100,
                 rule: LayerNormRule | Mapping | None = None, top_k: int = 3,
                 vectors: bool = True, histograms: bool = True, max_heatmap_rows: int = 200) -> None:
        super().__init__(out_dir, every_n_steps, image_every_n_steps, vectors)
        self.rule = LayerNormRule.from_mapping(dict(rule) if isinstance(rule, Mapping) else rule)
        self.top_k = int(top_k)
        self.histograms = bool(histograms)
        self.max_heatmap_rows = int(max_heatmap_rows)
        self.initial: dict[str, tuple[torch.Tensor, torch.Tensor | None]] | None = None
        self._initial_from_checkpoint = False
        self._heat_steps: list[int] = []
        self._heat: dict[str, dict[str, list[np.ndarray]]] = {"gain": {}, "bias": {}}
        self._tracked: dict[str, list[int]] = {}

    # -- state (the init snapshot survives resume) ---------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.initial is None:
            return {}
        return {"initial": {n: {"weight": w, "bias": b} for n, (w, b) in self.initial.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        init = state_dict.get("initial")
        if init:
            self.initial = {n: (v["weight"].float().cpu(), None if v["bias"] is None else v["bias"].float().cpu())
                            for n, v in init.items()}
            self._initial_from_checkpoint = True

    # -- OutlierMonitor API ---------------------------------------------------------------------------
    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule, resumed: bool) -> None:
        lns = module_layernorms(pl_module)
        det = layernorm_outliers_notice(lns, self.rule)
        if det:  # e.g. model.norm=layernorm_noaffine / rmsnorm, or a block without norms: say so once, go on
            rank_zero_warn(f"LayerNormMonitor ({type(getattr(pl_module, 'model', pl_module)).__name__}): {det}")
        self._heat_steps, self._heat, self._tracked = [], {"gain": {}, "bias": {}}, {}
        if not resumed:
            self.initial = layernorm_snapshot(lns)
        elif not self._initial_from_checkpoint:
            self.initial = None
            rank_zero_warn("LayerNormMonitor: the checkpoint holds no initial LayerNorm snapshot (trained without "
                           "this monitor?); divergence is measured from the standard init (gain 1, bias 0)")

    def after_resume(self, step: int) -> None:
        if not self.vectors:
            return
        try:
            rows = read_history(self.history.path, ("gain", "bias"))
        except FileNotFoundError:
            return
        for part in ("gain", "bias"):
            for name, (steps, m) in vectors_by_step(rows, part).items():
                self._heat[part][name] = list(m.numpy())
                self._heat_steps = steps
        self._thin_heat()

    def compute(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, vectors: bool
                ) -> tuple[list, dict]:
        params = layernorm_tensors(module_layernorms(pl_module))
        rows, summary = layernorm_records(step, params, self.initial, rule=self.rule, top_k=self.top_k,
                                          vectors=vectors)
        summary["params"] = {n: p for n, p in params.items() if p[0] is not None}
        self._heat_steps.append(step)
        for name, (w, b) in summary["params"].items():
            self._heat["gain"].setdefault(name, []).append(w.numpy())
            if b is not None:
                self._heat["bias"].setdefault(name, []).append(b.numpy())
        self._thin_heat()
        return rows, summary

    def _thin_heat(self) -> None:
        n = len(self._heat_steps)
        if n <= 2 * self.max_heatmap_rows:
            return
        keep = plots.thin(self._heat_steps, self.max_heatmap_rows)
        self._heat_steps = [self._heat_steps[i] for i in keep]
        for part in self._heat.values():
            for name, hist in part.items():
                if len(hist) == n:
                    part[name] = [hist[i] for i in keep]

    def log_to(self, writer: Any, step: int, summary: dict, images: bool) -> None:
        for rec in summary["stats"]:
            name = rec["name"]
            base = f"monitor/layernorm/{name}"
            w, b = summary["params"][name]
            for part, vec in (("gain", w), ("bias", b)):
                if vec is None:
                    continue
                writer.add_scalar(f"{base}/n_{part}_outliers", rec[f"n_{part}_outliers"], step)
                writer.add_scalar(f"{base}/max_abs_{part}_div", rec[f"max_abs_{part}_div"], step)
                tracked = self._tracked.setdefault(f"{name}/{part}", [])
                for d in summary["flagged"][part][name][: self.top_k]:
                    if d not in tracked and len(tracked) < 3 * self.top_k:
                        tracked.append(d)
                for d in tracked:
                    writer.add_scalar(f"{base}/{part}_dim_{d}", float(vec[d]), step)
                if self.histograms:
                    writer.add_histogram(f"{base}/{part}", vec, step)
        writer.add_scalar("monitor/layernorm/n_outlier_dims", len(summary["outliers"].dims), step)

    def figures(self, step: int, summary: dict) -> dict[str, Any]:
        figs = {}
        for part, centre in (("gain", 1.0), ("bias", 0.0)):
            hist = {n: np.stack(v) for n, v in self._heat[part].items() if len(v) == len(self._heat_steps)}
            if hist:
                figs[f"layernorm/heatmap_{part}"] = plots.layernorm_heatmap(
                    self._heat_steps, hist, summary["flagged"][part], part, centre)
        return figs
