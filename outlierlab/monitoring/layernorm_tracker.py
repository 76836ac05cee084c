"""The LayerNorm half of every outlier monitor: gain/bias 3σ outliers and divergence from init, on any model.

Kovaleva et al. (2021) flag the dims of each output LayerNorm whose gain and bias both lie outside mean ± 3σ; Puccetti
et al. (2022) call a dim a model outlier when more than 3 of 12 layers flag it, and follow how far gains move from init.
``LayerNormTracker`` holds the initial snapshot, the heatmap history and the dims shown as scalars, and calls
``monitor_records.layernorm_records`` (THE rule, ``layernorm_rule.layernorm_outliers``) on the norms
``models.layernorms.model_layernorms`` finds.  The Lightning, plain-loop and HF monitors all drive this one object, so
they write the same rows and tags.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from outlierlab.metrics.layernorm_rule import LayerNormRule, layernorm_outliers
from outlierlab.metrics.monitor_records import layernorm_records, layernorm_snapshot
from outlierlab.models.layernorms import layernorm_tensors, model_layernorms
from outlierlab.monitoring import monitor_plots as plots
from outlierlab.monitoring.history import read_history, vectors_by_step
from . import arguments

__all__ = ["LayerNormTracker", "layernorm_outliers_notice", "initial_from_state"]


def initial_from_state(state: Mapping[str, Any] | None) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]] | None:
    """The initial LayerNorm ``{name: (gain, bias)}`` (float32, CPU) of a ``LayerNormTracker.state_dict``
    (``layernorm_initial.pt``, or a checkpoint's monitor-callback state); None when it holds none."""
    init = (state or {}).get("initial")
    if not init:
        return None
    return {n: (v["weight"].float().cpu(), None if v["bias"] is None else v["bias"].float().cpu())
            for n, v in init.items()}


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


class LayerNormTracker:
    """LayerNorm gain/bias statistics of one model over training (Kovaleva et al. 2021; Puccetti et al. 2022).

    ``rule``: THE LayerNorm-outlier rule (None: Kovaleva et al.'s default; its ``k`` is also the statistics' σ).
    ``top_k``: flagged dims per LayerNorm shown as scalars, and top-|z| dims written.  ``histograms``: gain/bias
    histograms.  ``max_heatmap_rows``: steps kept (evenly thinned) for the heatmap.  ``initial``: the snapshot
    divergence is measured from (None: gain 1, bias 0).
    """

    filename = "layernorm.csv"

    def __init__(self, rule: LayerNormRule | Mapping | None = None, top_k: int = 3, histograms: bool = True,
                 max_heatmap_rows: int = 200) -> None:
        if rule is not None and not isinstance(rule, (LayerNormRule, Mapping)):
            raise TypeError(f"rule must be a LayerNormRule, a mapping of its keys (k, criterion, layernorms, "
                            f"min_layers) or None, got {rule!r} ({type(rule).__name__})")
        self.rule = LayerNormRule.from_mapping(dict(rule) if isinstance(rule, Mapping) else rule)
        self.top_k = arguments.count("top_k", top_k, 1)
        self.histograms = arguments.flag("histograms", histograms)
        # the heatmap keeps the first and the last recorded step: fewer than 2 rows would drop the last
        self.max_heatmap_rows = arguments.count("max_heatmap_rows", max_heatmap_rows, 2)
        self.initial: dict[str, tuple[torch.Tensor, torch.Tensor | None]] | None = None
        self.initial_restored = False  # the snapshot came from a checkpoint / file, not from this run's start
        self._heat_steps: list[int] = []
        self._heat: dict[str, dict[str, list[np.ndarray]]] = {"gain": {}, "bias": {}}
        self._tracked: dict[str, list[int]] = {}

    # -- the init snapshot (survives a resume through a checkpoint or a file) -------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.initial is None:
            return {}
        return {"initial": {n: {"weight": w, "bias": b} for n, (w, b) in self.initial.items()}}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        init = initial_from_state(state_dict)
        if init:
            self.initial = init
            self.initial_restored = True

    # -- session ---------------------------------------------------------------------------------------
    def begin(self, model: nn.Module, resumed: bool) -> list[str]:
        """Start a training session; returns notices for the caller to warn with.  A fresh session snapshots the norms
        as initial values; a resumed one keeps the snapshot ``load_state_dict`` restored, else gain 1 / bias 0."""
        lns = model_layernorms(model)
        notices = []
        det = layernorm_outliers_notice(lns, self.rule)
        if det:  # e.g. model.norm=layernorm_noaffine / rmsnorm, or a block without norms: say so once, go on
            notices.append(f"LayerNormMonitor ({type(model).__name__}): {det}")
        self._heat_steps, self._heat, self._tracked = [], {"gain": {}, "bias": {}}, {}
        if not resumed:
            self.initial = layernorm_snapshot(lns)
        elif not self.initial_restored:
            self.initial = None
            notices.append("LayerNormMonitor: the checkpoint holds no initial LayerNorm snapshot (trained without "
                           "this monitor?); divergence is measured from the standard init (gain 1, bias 0)")
        return notices

    def reload(self, history_path: str | Path) -> None:
        """After a resume: reload the heatmap data of the steps kept in the history (vector rows)."""
        try:
            rows = read_history(history_path, ("gain", "bias"))
        except FileNotFoundError:
            return
        for part in ("gain", "bias"):
            for name, (steps, m) in vectors_by_step(rows, part).items():
                self._heat[part][name] = list(m.numpy())
                self._heat_steps = steps
        self._thin_heat()

    # -- one record ------------------------------------------------------------------------------------
    def compute(self, model: nn.Module, step: int, vectors: bool = True) -> tuple[list, dict]:
        """History rows and a summary (for ``log_to`` / ``figures``) of the model's norms now."""
        params = layernorm_tensors(model_layernorms(model))
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
        """Scalars (and histograms) to one TensorBoard ``SummaryWriter``-like writer."""
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
        """Heatmaps of gain and bias per dim over the recorded steps (Kovaleva et al. Fig. 3 middle)."""
        figs = {}
        for part, centre in (("gain", 1.0), ("bias", 0.0)):
            hist = {n: np.stack(v) for n, v in self._heat[part].items() if len(v) == len(self._heat_steps)}
            if hist:
                figs[f"layernorm/heatmap_{part}"] = plots.layernorm_heatmap(
                    self._heat_steps, hist, summary["flagged"][part], part, centre)
        return figs
