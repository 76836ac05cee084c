"""The modern outlier metrics in ``evaluate.py``'s streaming pass, for any encoder (ours or Hugging Face).

``ActivationObserver`` subscribes to the forward of ``run_sentence_pass``, so these cost no extra encoding:

kurtosis (He et al. 2024), max/median (He et al. 2024; Sun et al. 2024), the largest |x| with its dim and token and
the |x|-argmax share of every hidden state's raw tokens; |x|-argmax counts by position bucket (Luo et al. 2021 §3);
‖x‖∞ at the FFN output and around the output LayerNorm (Bondarenko et al. 2023) over the non-pad tokens, special
tokens included (BERT's largest sit on ``[SEP]``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from outlierlab.metrics.activations import ActivationAccumulator
from outlierlab.metrics.layer_accumulators import stack_layers
from outlierlab.metrics.position_shares import PositionArgmaxCounts, token_positions
from outlierlab.evaluation.sentence_stream import Consumer
from outlierlab.models.sites import SITE_NAMES, InfNormRecorder
from outlierlab.utils.tables import md_table

__all__ = ["ActivationObserver", "activation_columns", "activation_section", "ACTIVATION_COLUMNS"]

ACTIVATION_COLUMNS = ["kurtosis", "max_median", "max_abs", "max_abs_dim", "max_abs_token", "abs_argmax_dim",
                      "abs_argmax_share"] + [f"inf_norm_{s}" for s in SITE_NAMES]


class ActivationObserver(Consumer):
    """Raw valid tokens into an ``ActivationAccumulator``, inf-norm hooks on the model during the forward."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder
        self.layer_accs = [ActivationAccumulator(1, encoder.hidden_size) for _ in range(encoder.num_layers + 1)]
        self.by_position = PositionArgmaxCounts(encoder.num_layers + 1, encoder.hidden_size)
        self._positions: tuple = (None, None)  # (the batch, its tokens' positions)
        self.acc: ActivationAccumulator | None = None  # the layers stacked, once every layer is complete
        self.token_ids: dict[int, int] = {}  # running token index -> id, only for the current maxima
        self.recorder: InfNormRecorder | None = None
        self.note = ""
        self.key = ("activations",)  # one observer (and one set of hooks) per pass, whoever asks

    def open(self, stream) -> None:
        try:
            self.recorder = InfNormRecorder(self.encoder.model).__enter__()
        except ValueError as e:  # an encoder whose blocks we cannot name: the rest still works
            self.recorder, self.note = None, f"inf-norm sites not recorded: {e}"

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.__exit__(None, None, None)

    def update(self, layer: int, vectors: Tensor, batch) -> None:
        """One layer of one batch: ``vectors [1, N, d]``; the batch's token ids name the max-|x| token."""
        acc = self.layer_accs[layer]
        offset, before = acc.n_tokens, acc.max_token.clone()
        acc.update(vectors)
        if self._positions[0] is not batch:  # once per batch: every layer's tokens sit at the same positions
            grid = batch.attention_mask if batch.attention_mask is not None else torch.ones_like(batch.valid)
            self._positions = (batch, token_positions(grid, batch.valid.to(grid.device)))
        self.by_position.update(layer, vectors.reshape(-1, vectors.shape[-1]), self._positions[1])
        if batch.token_ids is not None:  # a layer whose maximum moved to this batch: remember that token's id
            for tok in acc.max_token[acc.max_token != before].tolist():
                if tok >= offset:
                    self.token_ids[tok] = int(batch.token_ids[tok - offset])

    def end_batch(self, batch) -> None:
        """The inf-norm hooks' maxima over the batch's non-pad tokens."""
        if self.recorder is not None:
            self.recorder.commit(batch.attention_mask.bool())

    def end_layer(self, layer: int) -> None:
        if layer == len(self.layer_accs) - 1:  # the same numbers as feeding all layers at once
            self.acc = stack_layers(self.layer_accs)

    def token_text(self, layer: int) -> str:
        tid = self.token_ids.get(int(self.acc.max_token[layer]))
        return "" if tid is None else self.encoder.tokenizer.convert_ids_to_tokens(tid)


def activation_columns(obs: ActivationObserver) -> list[dict]:
    """Per hidden-state layer the ``ACTIVATION_COLUMNS`` values (inf-norms empty for layer 0)."""
    inf = obs.recorder.result() if obs.recorder is not None else {}
    out = []
    for i, s in enumerate(obs.acc.summary()):
        row = {**s, "max_abs_token": obs.token_text(i)}
        for site in SITE_NAMES:
            v = float(inf[site][i]) if site in inf else math.nan
            row[f"inf_norm_{site}"] = "" if math.isnan(v) else v
        out.append(row)
    return out


def activation_section(cols: list[dict], note: str = "") -> str:
    """Markdown: kurtosis, max/median, max |x| (dim, token) and inf-norms per layer."""
    lines = ["### Activation kurtosis, max/median, inf-norm (He et al. 2024; Sun et al. 2024; Bondarenko et al. 2023)",
             "Raw vectors, non-special non-pad tokens (inf-norms: all non-pad tokens, special tokens included). "
             "Kurtosis of the per-dim RMS: 1 = all dims equal, d = one dim holds everything; max/median: mean over "
             "tokens of max|x| / median|x|.",
             ""]
    rows = [[i, f"{c['kurtosis']:.3g}", f"{c['max_median']:.3g}",
             f"{c['max_abs']:.3g} ({c['max_abs_dim']}, `{c['max_abs_token']}`)",
             f"{c['abs_argmax_dim']} ({100 * c['abs_argmax_share']:.1f}%)",
             *((f"{c[k]:.3g}" if c[k] != "" else "–") for k in ("inf_norm_ffn_output", "inf_norm_ln_input",
                                                                  "inf_norm_ln_output"))] for i, c in enumerate(cols)]
    lines.append(md_table(["layer", "kurtosis", "max/median", "max \\|x\\| (dim, token)", "\\|x\\|-argmax dim (share)",
                           "inf-norm FFN out", "LN input", "LN output"], rows, cell=str))
    if note:
        lines += ["", f"_{note}_"]
    return "\n".join(lines)


def position_share_section(rows: list[dict]) -> str:
    """Markdown: per layer, the share of its |x|-argmax dim in each position bucket, with their tokens."""
    buckets = list(dict.fromkeys(r["positions"] for r in sorted(rows, key=lambda r: r["first_position"])))
    by_layer: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_layer.setdefault(r["layer"], {})[r["positions"]] = r
    table = [[layer, cells[next(iter(cells))]["layer_dim"],
              *(f"{cells[b]['layer_dim_share']:.2f}" if b in cells else "–" for b in buckets)]
             for layer, cells in by_layer.items()]
    first = next(iter(by_layer.values()), {})
    counts = ", ".join(f"{b}: {first[b]['n_tokens']}" for b in buckets if b in first)
    return "\n".join([
        "### The |x|-argmax share by position (is the dominant dimension positional? Luo et al. 2021 §3)",
        "Raw vectors, non-special non-pad tokens; positions are indices in the tokenized sequence (0 = `<s>`/"
        "`[CLS]`), in buckets that double in width. Each cell: the share of the bucket's tokens whose largest |x| "
        "is on the layer's |x|-argmax dim. A share that changes with position makes the layer's share over all "
        "tokens depend on how long the texts are. Each bucket's own top dim: `outliers_by_position.csv`.",
        "",
        md_table(["layer", "dim", *(f"pos. {b}" for b in buckets)], table, cell=str),
        "",
        f"_Tokens per bucket (layer 0): {counts}._" if counts else ""]).rstrip()
