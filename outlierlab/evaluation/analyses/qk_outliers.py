"""``evaluate.py`` analysis ``qk_outliers``: query/key outlier features per layer × head × dim, and for rotary positions
the pair and frequency each lies in (Jonasson 2025, "Rotary Offset Features in Large Language Models").

q and k are hooked just before the rotation (``models.qk_recorder.qk_projections``: the projections, or a QK-norm where
a block has one) while the evaluation sentences are encoded; per layer × head × dim the max and mean |q_d|, |k_d| over
every real token (special tokens included: sinks live there) are streamed (``QKAccumulator``); a dim is an outlier of
its head by ``magnitude_outliers`` (max more than ``qk_outliers.k`` σ above the head's mean).  With rotary positions
(our ``pos=rope``; Llama, GPT-NeoX, ModernBERT, Qwen3) each dim gets its pair, frequency θ_i (the model's ``inv_freq``:
scaling, partial rotary, per layer type) and cycles over the layer's reach T, beside the partial-cycle bound
(``RotarySpec``); other schemes get the magnitudes alone.

Output: ``qk_outliers.csv`` (per layer × head × dim), ``qk_outliers.png`` (max |q|, |k| heatmaps of (layer, head) × dim,
Jonasson's Fig. 1, pair halves marked), a report table per layer.
"""

from __future__ import annotations

import contextlib

import torch
from matplotlib.figure import Figure

from outlierlab.metrics.qk_magnitudes import RotarySpec, magnitude_outliers
from outlierlab.evaluation.sentence_stream import Consumer, LayerStream, StreamBatch
from outlierlab.evaluation.registry import AnalysisResult, EvalContext, analysis_texts, check_texts
from outlierlab.configuration.run_settings import DataSettings
from outlierlab.configuration.analysis_settings import QKOutliersSettings
from outlierlab.models.family_spec import is_norm
from outlierlab.models.qk_recorder import QKRecorder, rotary_specs
from outlierlab.utils.atomic import save_figure
from outlierlab.utils.tables import md_table

TITLE = "## Query/key outlier features and rotary pairs (Jonasson 2025)"
COLUMNS = ["layer", "head", "dim", "q_max", "q_mean", "k_max", "k_mean", "q_z", "k_z", "q_outlier", "k_outlier",
           "rotary_pair", "partner_dim", "theta", "cycles", "within_bound"]


# ------------------------------------------------------------------------------------------------- rows
class QKConsumer(Consumer):
    """The recorder's hooks around the stream's forward: q/k reduced layer by layer inside the model."""

    def __init__(self, rec: QKRecorder) -> None:
        self.rec, self.hooks = rec, contextlib.ExitStack()

    def open(self, stream) -> None:
        self.hooks.enter_context(self.rec.hooked())

    def start_batch(self, batch: StreamBatch) -> None:
        self.rec.expect(batch.attention_mask)

    def update(self, layer: int, vectors: torch.Tensor, batch: StreamBatch) -> None:
        """The hidden states themselves are not needed."""

    def end_batch(self, batch: StreamBatch) -> None:
        self.rec.observe(batch.attention_mask)

    def close(self) -> None:
        self.hooks.close()


def qk_rows(stats: dict, specs: list[RotarySpec | None], k: float) -> list[dict]:
    """One row per layer × head × dim (``COLUMNS``); a key head shared by several query heads (GQA) is
    repeated for each of them."""
    q_mask, q_z = magnitude_outliers(stats["q_max"], k)
    k_mask, k_z = magnitude_outliers(stats["k_max"], k)
    n_layers, n_heads, hd = stats["q_max"].shape
    group = n_heads // stats["k_max"].shape[1]
    rows = []
    for layer in range(n_layers):
        spec = specs[layer]
        for head in range(n_heads):
            kh = head // group
            for d in range(hd):
                pair = spec.pair(d) if spec is not None else None
                row = {"layer": layer, "head": head, "dim": d, "q_max": float(stats["q_max"][layer, head, d]),
                       "q_mean": float(stats["q_mean"][layer, head, d]), "k_max": float(stats["k_max"][layer, kh, d]),
                       "k_mean": float(stats["k_mean"][layer, kh, d]), "q_z": float(q_z[layer, head, d]),
                       "k_z": float(k_z[layer, kh, d]), "q_outlier": bool(q_mask[layer, head, d]),
                       "k_outlier": bool(k_mask[layer, kh, d]), "rotary_pair": "", "partner_dim": "", "theta": "",
                       "cycles": "", "within_bound": ""}
                if pair is not None:
                    i, partner = pair
                    row.update(rotary_pair=i, partner_dim=partner, theta=spec.theta(i), cycles=spec.cycles(i),
                               within_bound=spec.within_bound(i))
                rows.append(row)
    return rows


def _heatmap(stats: dict, specs, path, title: str) -> None:
    panels = [("max |q|", stats["q_max"]), ("max |k|", stats["k_max"])]
    fig = Figure(figsize=(11, 4.5))
    axes = fig.subplots(1, 2)
    for ax, (name, v) in zip(axes, panels):
        n_layers, n_heads, hd = v.shape
        im = ax.imshow(v.reshape(n_layers * n_heads, hd).numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
        spec = specs[0]
        if spec is not None:  # rotary (left of r) vs not; first vs second half of each pair (half layout)
            ax.axvline(spec.rotary_dim - 0.5, color="red", ls="--", lw=1)
            ax.axvline(spec.rotary_dim / 2 - 0.5, color="white", ls="--", lw=1)
        for layer in range(1, n_layers):
            ax.axhline(layer * n_heads - 0.5, color="black", lw=0.3)
        ax.set(xlabel="dim within head", ylabel="layer × head", title=name)
        fig.colorbar(im, ax=ax)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


# ---------------------------------------------------------------------------------------------- the job
def check(ctx: EvalContext) -> QKOutliersSettings:
    """Settings and text files before any model is loaded."""
    s = ctx.settings(QKOutliersSettings)
    check_texts(s)
    return s


def run(ctx: EvalContext) -> AnalysisResult:
    s = ctx.prepared if isinstance(ctx.prepared, QKOutliersSettings) else check(ctx)
    enc = ctx.encoder
    model = enc.model
    texts, what = analysis_texts(ctx, s)
    chunk = ctx.settings(DataSettings).chunk
    rec = QKRecorder(model)
    specs = rotary_specs(model, len(rec.projs), rec.acc.head_dim, s.max_cycles)
    LayerStream(enc, texts, chunk=chunk).forward([QKConsumer(rec)], desc="qk_outliers")
    stats = rec.acc.result()
    rows = qk_rows(stats, specs, s.k)
    fig = ctx.out_dir / "qk_outliers.png" if ctx.plots else None
    rotary = specs[0] is not None
    if fig is not None:
        _heatmap(stats, specs, fig, f"{enc.source.name}: max |q_d|, |k_d| per (layer, head) × dim"
                 + (" — red: rotary | not, white: first | second dim of each pair" if rotary
                    else " (no rotary positions)"))
    per_layer = []
    for layer in range(len(rec.projs)):
        rs = [r for r in rows if r["layer"] == layer]
        out_q = [r for r in rs if r["q_outlier"]]
        out_k = [r for r in rs if r["k_outlier"]]
        line = [layer, len(out_q), len(out_k),
                ", ".join(f"h{r['head']}:{r['dim']}" for r in sorted(out_q, key=lambda r: -r["q_z"])[:4]) or "–",
                ", ".join(f"h{r['head']}:{r['dim']}" for r in sorted(out_k, key=lambda r: -r["k_z"])[:4]) or "–"]
        if rotary:
            flagged = out_q + out_k
            inside = sum(1 for r in flagged if r["within_bound"] is True)
            all_rot = [r for r in rs if r["within_bound"] != ""]
            base = sum(1 for r in all_rot if r["within_bound"] is True) / max(1, len(all_rot))
            line += [f"{inside}/{len(flagged)}" if flagged else "–", base]
        per_layer.append(line)
    headers = ["layer", "# q outlier dims", "# k outlier dims", "top q (head:dim)", "top k (head:dim)"]
    if rotary:
        headers += ["outliers in partial-cycle pairs", "share of all rotary dims in them"]
    spec = specs[0]
    bound = (f"Rotary: {spec.layout} layout, r = {spec.rotary_dim} of {spec.head_dim} dims, θ_i from {spec.source} "
             f"(the frequencies the model rotates by), context T = {spec.context}: pair i turns θ_i·T/2π times over "
             "the context; pairs i ≥ "
             f"{spec.first_partial_pair()} make fewer than {spec.max_cycles:g} turn(s) (the partial-cycle bound: where "
             "Jonasson's rotary offset features are expected)"
             + (" — layer 0; the layers differ (frequencies, window): per-layer values in the CSV." if len(set(specs)) > 1
                else ".") if rotary else
             "No rotary positions in this model: per-dim magnitudes alone, no pair named.")
    names = {id(m): n for n, m in model.named_modules()}
    p0 = rec.projs[0]
    read = (f"the outputs of `{names.get(id(p0.q), '?')}` / `{names.get(id(p0.k), '?')}` (block 0; the same in every "
            "block)" + (" — after the QK-norm, whose gain scales dims before the rotation" if is_norm(p0.q)
                        else " — the projections: no QK-norm in this model"))
    md = [TITLE,
          f"q and k where the model rotates them, just before the rotation: {read}; every real token of "
          f"{what}. Outlier dim of a head: "
          f"its max |·| more than {s.k:g}σ above the mean over the head's {rec.acc.head_dim} dims. {bound}",
          md_table(headers, per_layer), "![max |q|, |k| per layer, head and dim](qk_outliers.png)"]
    summary = {"rotary": rotary, "qk_read_at": [names.get(id(p0.q), "?"), names.get(id(p0.k), "?")],
               "n_q_outliers": sum(r["q_outlier"] for r in rows),
               "n_k_outliers": sum(r["k_outlier"] for r in rows)}
    return AnalysisResult("qk_outliers", rows, "\n\n".join(md), [fig], summary)
