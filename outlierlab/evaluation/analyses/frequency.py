"""``evaluate.py`` analysis ``frequency``: outlier-dim magnitude vs token frequency (Puccetti et al. 2022).

Puccetti et al. (2022), "Outlier Dimensions that Disrupt Transformers Are Driven by Frequency": a LayerNorm outlier
dim's value on a token grows with the token's *pretraining* frequency.  Per token type of the evaluation text
(non-special tokens):

* frequency — its count in the model's pretraining corpus when known (our train.py runs: the run's config names the
  data, re-read and tokenised with the run's tokenizer, cached), else in the evaluation text
  (``frequency.counts_from``);
* value — per layer, the mean |h_j| of each outlier dim over the type's occurrences (``frequency.value=signed``: the
  signed mean; ``frequency_stats.TokenValueAccumulator``), layer 0 = embedding output;
* Spearman ρ per layer × dim (``frequency_stats.token_frequency_spearman``) and a scatter plot (log₁₀ frequency vs
  magnitude) of the strongest dim at a middle and the last layer.

With the model's LM head (the ``objective`` column): ρ between frequency and the output weight ``W_out[v, j]``
(``head_spearman``), Macocco et al. (2025)'s route; only where the output layer reads the hidden dims themselves
(decoders), else the column is empty and the report says why.

Outlier dims: ``frequency.dims``, else the LayerNorm outlier dims by the one rule (``ln_rule``); if none, the activation
outlier dims (``detect_outlier_dims``, Luo et al.'s share), said in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from outlierlab.metrics.frequency_stats import FrequencyTable, frequency_table, token_frequency_spearman
from outlierlab.metrics.outlier_dims import detect_outlier_dims
from outlierlab.datamodules.corpus import load_texts_from_files
from outlierlab.datamodules.mlm_datamodule import default_cache_dir  # the one definition of the cache root
from outlierlab.datamodules.token_counts import count_tokens, pretraining_counts
from outlierlab.evaluation.analyses.ln_rule import check_common, detect_layernorm_outliers, ln_rule
from outlierlab.evaluation.registry import AnalysisResult, EvalContext, analysis_texts, shared_mlm
from outlierlab.configuration.run_settings import DataSettings
from outlierlab.configuration.analysis_settings import FrequencySettings
from outlierlab.evaluation.sentence_stream import Consumer, LayerStream, StreamBatch
from outlierlab.evaluation.sentence_pass import OutlierCounts
from outlierlab.models.families import unembedding
from outlierlab.models.layernorms import UnknownFamilyError, model_layernorms
from outlierlab.utils.atomic import save_figure
from outlierlab.utils.tables import md_table

#: Scores with the model's LM head: evaluate.py loads the encoder with it, once.
LM_HEAD = True

TITLE = "## Outlier dims vs token frequency (Puccetti et al. 2022)"


class DimColumns(Consumer):
    """``(token ids [n], values [L+1, n, len(dims)])`` of every batch's valid tokens for ``frequency_spearman``, each
    layer's ``dims`` columns taken as the layer is produced."""

    def __init__(self, dims: Sequence[int]) -> None:
        self.idx = torch.as_tensor(list(dims), dtype=torch.long)
        self.cols: dict[int, Tensor] = {}
        self.chunks: list[tuple[Tensor, Tensor]] = []

    def update(self, layer: int, vectors: Tensor, batch: StreamBatch) -> None:
        self.cols[layer] = vectors[0][:, self.idx.to(vectors.device)].cpu()

    def end_batch(self, batch: StreamBatch) -> None:
        self.chunks.append((batch.token_ids.cpu(), torch.stack([self.cols[i] for i in range(len(self.cols))])))
        self.cols = {}


def _stream(ctx, texts: Sequence[str], consumer: Consumer) -> Consumer:
    """``consumer`` fed by one forward of the per-layer stream over ``texts``."""
    chunk = ctx.settings(DataSettings).chunk
    LayerStream(ctx.encoder, texts, chunk=chunk).forward([consumer], desc="frequency")
    return consumer


def choose_dims(ctx, s: FrequencySettings, stats_fn) -> tuple[list[int], str, str]:
    """(dims, tag, description): user dims, LayerNorm outlier dims, else activation outlier dims."""
    max_dims = s.max_dims
    if s.dims:
        return list(s.dims), "user", "given by frequency.dims"
    try:
        det = detect_layernorm_outliers(model_layernorms(ctx.encoder.model), ln_rule(ctx))
        ln_said = det.describe()
    except UnknownFamilyError as e:  # an unregistered family: its norms are unknown, activations still work
        det, ln_said = None, str(e)
    if det is not None and det.dims:
        return det.dims[:max_dims], "layernorm", "LayerNorm outliers: " + ln_said
    share = s.share_threshold
    stats = stats_fn()
    per_layer = detect_outlier_dims(stats, method="share", threshold=share)
    score = torch.maximum(stats["argmax_share"], stats["argmin_share"]).max(0).values
    dims = sorted({d for ds in per_layer for d in ds}, key=lambda d: -float(score[d]))
    if dims:
        why = (f"no LayerNorm outlier dim ({ln_said}); activation outliers instead "
               f"(argmax/argmin share ≥ {share:g} in some layer, Luo et al. 2021)")
        return dims[:max_dims], "activation", why
    top = stats["mean"].abs().max(0).values.argsort(descending=True)[:max_dims].tolist()
    why = (f"no LayerNorm or activation outlier dim; the {len(top)} dims with the largest |mean activation| "
           "instead (no outlier structure: read ρ with care)")
    return top, "top_mean", why


def _scatter(table: FrequencyTable, layers: Sequence[int], strongest: dict[int, int], path: Path, what: str,
             title: str) -> Path:
    fig = Figure(figsize=(5 * len(layers), 4))
    axes = fig.subplots(1, len(layers), squeeze=False)
    keep = table.freqs > 0
    x = np.log10(table.freqs[keep])
    for ax, layer in zip(axes[0], layers):
        j = table.dims.index(strongest[layer])
        y = table.means[layer, keep, j].numpy()
        ax.scatter(x, y, s=6, alpha=0.4)
        ax.set(xlabel="log10 token frequency", ylabel=f"{what} of dim {strongest[layer]}",
               title=f"layer {layer}, dim {strongest[layer]}: ρ = {float(table.rho[layer, j]):.2f}")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return path


def head_spearman(loaded, table: FrequencyTable) -> tuple[list[float] | None, str]:
    """Per outlier dim, Spearman ρ between type frequency and the LM head's weight ``W_out[v, j]`` on it
    (None without LM-head weights), and one line saying what was used."""
    w = unembedding(loaded.model) if loaded.has_mlm_head else None
    if w is None:
        return None, f"LM head: not used ({loaded.no_head_reason or 'no output layer'})"
    if loaded.objective != "next_token" or w.shape[1] != loaded.hidden_size:
        return None, ("LM head: not read (the masked-LM head's dense transform mixes the hidden dims before its "
                      "output layer, so W_out's columns are not the outlier dims)")
    if int(table.type_ids.max()) >= w.shape[0]:
        return None, "LM head: not read (its output layer does not cover the tokenizer's ids)"
    values = w.detach().cpu().to(torch.float64)[torch.from_numpy(table.type_ids)][:, table.dims]
    rho = token_frequency_spearman(torch.from_numpy(table.freqs.astype(np.float64)), values)
    kind = "next-token" if loaded.objective == "next_token" else "masked-LM"
    return [float(r) for r in rho], (f"LM head ({kind}, the model's own): ρ between a type's frequency and its output "
                                     "weight on the dim, W_out[v, j] (Macocco et al. 2025), column `head_spearman`")


def check(ctx: EvalContext) -> FrequencySettings:
    """Settings and files, before any encoding (called by evaluate.py); the value checks (``counts_from``,
    ``value``, ...) run when the settings are built (``outlierlab.configuration.analysis_settings.FrequencySettings``)."""
    s = ctx.settings(FrequencySettings)
    check_common(ctx, s)  # also its texts and count_files
    # the encoder's depth is known before its first forward: a layer it lacks fails now, not after the pass
    n = ctx.encoder.num_layers + 1 if ctx.encoder is not None else None
    if n is not None and s.plot_layers is not None and any(not 0 <= x < n for x in s.plot_layers):
        raise ValueError(f"frequency.plot_layers {list(s.plot_layers)} outside 0..{n - 1} (0 = the embeddings, "
                         f"{n - 1} = the last layer)")
    return s


def frequency_counts(ctx, s: FrequencySettings, tokenized, vocab: int) -> tuple[np.ndarray, str]:
    """Frequency of every token id [vocab] and where it was counted (``frequency.counts_from``)."""
    enc, mode = ctx.encoder, s.counts_from
    note = ""
    if mode == "pretraining" or (mode == "auto" and enc.source.kind != "hf"):  # HF models: corpus unknown
        try:
            counts, what = pretraining_counts(enc.source, enc.tokenizer, default_cache_dir())
            return np.pad(counts, (0, max(0, vocab - len(counts)))), what
        except (OSError, ValueError, RuntimeError) as e:
            if mode == "pretraining":
                raise
            note = f"pretraining corpus not available ({(str(e).splitlines() or [''])[0][:160]}); "
    if mode == "files":
        files = list(s.count_files)
        return count_tokens(enc.tokenizer, load_texts_from_files(files), vocab), f"files {files}"
    ids = [t for row, sp in zip(tokenized.input_ids, tokenized.special_tokens_mask) for t, s in zip(row, sp) if not s]
    why = "" if mode == "eval" else (" — NOT the pretraining frequency Puccetti et al. use: this model's pretraining "
                                     "corpus is not known here (a hub/local model, not a train.py run)")
    return np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab), note + f"the evaluated text itself{why}"


def run(ctx: EvalContext) -> AnalysisResult:
    """Puccetti et al.'s frequency analysis (settings: ``configs/frequency/default.yaml``)."""
    s = check(ctx)
    enc = ctx.encoder
    texts, what = analysis_texts(ctx, s)
    tokenized = enc.tokenize(texts, report=False)  # the pass over the same texts reports the truncation
    # Luo et al.'s per-layer statistics: one extra pass, only when no LayerNorm outlier exists
    dims, dim_tag, dims_from = choose_dims(
        ctx, s, lambda: _stream(ctx, texts, OutlierCounts("none", enc.num_layers + 1)).result(enc.hidden_size).stats())
    if any(not 0 <= d < enc.hidden_size for d in dims):
        raise ValueError(f"frequency.dims {dims} outside 0..{enc.hidden_size - 1}")
    vocab = max([len(enc.tokenizer)] + [max(r) + 1 for r in tokenized.input_ids if r])
    counts, counts_from = frequency_counts(ctx, s, tokenized, vocab)
    min_occ, value = s.min_occurrences, s.value
    what_value = "mean magnitude |h|" if value == "magnitude" else "mean signed value"
    table = frequency_table(_stream(ctx, texts, DimColumns(dims)).chunks, dims, counts, min_occ,
                               magnitude=value == "magnitude", picked=True)

    L = table.rho.shape[0]
    w = torch.from_numpy(table.occurrences.astype(np.float64))
    mean = torch.einsum("lvj,v->lj", table.means, w) / w.sum()  # token-weighted mean value per layer and dim
    loaded = shared_mlm(ctx)
    head_rho, head_said = head_spearman(loaded, table)
    rows = [{"layer": l, "dim": d, "spearman": float(table.rho[l, j]), "value": value,
             "mean_value": float(mean[l, j]), "n_types": len(table.type_ids), "counts_from": counts_from,
             "dim_source": dim_tag, "objective": loaded.objective,
             "head_spearman": head_rho[j] if head_rho is not None else ""}
            for l in range(L) for j, d in enumerate(dims)]
    plot_layers = list(s.plot_layers) if s.plot_layers is not None else [L // 2, L - 1]  # null: middle, last
    if any(not 0 <= x < L for x in plot_layers):
        raise ValueError(f"frequency.plot_layers {plot_layers} outside 0..{L - 1}")
    strongest = {l: dims[int(mean[l].abs().argmax())] for l in plot_layers}
    fig_path = Path(ctx.out_dir or "") / "frequency_scatter.png"  # no run directory (in memory): plots are off
    fig = _scatter(table, plot_layers, strongest, fig_path, what_value,
                   f"{enc.source.name}: frequency from {counts_from[:90]}") if ctx.plots else None

    def rho(l, j):
        r = float(table.rho[l, j])
        return "n/a" if r != r else f"{r:+.2f}"

    cells = [[l, *(rho(l, j) for j in range(len(dims)))] for l in range(L)]
    if head_rho is not None:
        cells.append(["LM head W_out", *(f"{r:+.2f}" if r == r else "n/a" for r in head_rho)])
    md = [TITLE, "", f"Spearman ρ between a token type's frequency and its {what_value} on each outlier dim, "
          f"per layer: {len(table.type_ids)} token types seen ≥ {min_occ}× in {what} (special tokens "
          "excluded); layer 0 = embedding output. n/a: the dim is constant there.", "",
          md_table(["layer", *(f"dim {d}" for d in dims)], cells, cell=str)]
    md += ["", f"- Dims: {dims_from}.", f"- Frequencies counted on {counts_from}.", f"- {head_said}.",
           f"- Types never seen in that corpus: {int((table.freqs == 0).sum())} (kept for ρ, left out of the "
           "log-scale plot).", "", f"![frequency vs outlier value]({fig_path.name})", ""]
    last = plot_layers[-1]
    summary = {"dims": dims, "counts_from": counts_from,
               f"rho_layer{last}_dim{strongest[last]}": float(table.rho[last, dims.index(strongest[last])])}
    return AnalysisResult("frequency", rows, "\n".join(md), figures=[fig], summary=summary)
