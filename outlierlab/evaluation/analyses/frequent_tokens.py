"""``evaluate.py`` analysis ``frequent_tokens``: do the last layer's outlier dims implement "predict a frequent token"?
(Macocco et al. 2025, "Outlier dimensions favor frequent tokens in language models"; their code:
imacocco/llms_outlier_dimensions.  Shown there for decoders, here for any model with its own LM head.)

**Positions.** Decoders by default (``positions: late``), as Macocco et al.: ONE late position per sequence, token
``late_position`` (default 100; they take the last token of the 100th word, ``src/running.py``), scored against the next
token; shorter sequences are left out (said so).  ``positions: every`` scores every next-token position. Masked LMs: the
masked positions (deterministic 15%, as the ablation).  The vector h entering the output layer is captured and the
logits ``hW^T + b`` split over dims S (``frequent_token_logits.split_logits``):

* **S** by four rules — ``macocco`` (theirs on h), ``unembedding`` (theirs on the output weight rows:
  ``only_out``/``ablate_out``), ``argmax_share`` (Luo et al.'s rule on h) and ``layernorm`` (THE LayerNorm rule on
  the norm producing h);
* **conditions** — ``full``, ``only`` (h_S W_S^T), ``without`` (the model minus that term), both for ``n_random``
  draws of |S| random dims avoiding S and both Macocco sets (their ``not_rd``), and ``bias`` (when there is one);
* **per condition** — their ``lin_coeff`` (Spearman ρ and slope of prediction frequency on corpus frequency over
  the predicted tokens, distinct predicted tokens), top-1 accuracy, KL(full ‖ condition), entropy and surprisal;
  and ours, ``logprob_spearman`` over every counted token.  No correlatable prediction: NaN and ``lin_status``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from outlierlab.metrics.frequent_token_logits import COLUMNS, METRICS, macocco_outlier_dims, score_conditions
from outlierlab.metrics.layernorm_rule import LayerNormRule, layernorm_outliers
from outlierlab.metrics.outlier_dims import detect_outlier_dims
from outlierlab.metrics.outlier_stats import OutlierAccumulator
from outlierlab.evaluation.registry import (AnalysisResult, EvalContext, check_texts, scored_texts, shared_mlm,
                                            skip_result)
from outlierlab.evaluation.analyses.ln_rule import ln_rule
from outlierlab.evaluation.analyses.frequency import frequency_counts
from outlierlab.datamodules.scoring_batches import masked_batches, next_token_batches
from outlierlab.models.lm_model import LoadedModel, last_vectors, output_layer
from outlierlab.configuration.analysis_settings import FrequentTokensSettings
from outlierlab.models.layernorms import layernorm_tensors
from outlierlab.utils.atomic import save_figure
from outlierlab.utils.tables import md_table

#: Scores with the model's LM head: evaluate.py loads the encoder with it, once.
LM_HEAD = True

__all__ = ["run", "check", "COLUMNS", "METRICS", "RULES", "score_conditions", "late_labels", "outlier_sets"]

TITLE = "## Last-layer outlier dims and the frequent-token heuristic (Macocco et al. 2025)"
RULES = ("macocco", "unembedding", "argmax_share", "layernorm")


def late_labels(batches, position: int) -> tuple[list[dict], int]:
    """Macocco et al.'s position protocol: keep only each sequence's label at ``position``; returns ``(batches,
    sequences left out)``, those whose ``position`` has no target (too short, or a special next token)."""
    out, skipped = [], 0
    for b in batches:
        lab = b["labels"]
        keep = torch.full_like(lab, -100)
        if lab.shape[1] > position:
            keep[:, position] = lab[:, position]
        skipped += lab.shape[0] - int((keep != -100).any(1).sum())
        out.append({**b, "labels": keep})
    return out, skipped


# ------------------------------------------------------------------------------------------- the dims
def outlier_sets(loaded: LoadedModel, h: Tensor, weight: Tensor, s: FrequentTokensSettings, rule: LayerNormRule,
                 norm_key: str) -> dict[str, tuple[list[int], str]]:
    """``{rule: (dims, how)}`` for ``RULES`` (a rule that cannot judge gives ``[]`` and says why)."""
    how = f"median |·| > the {s.percentile:g}th percentile of all |·|"
    out = {"macocco": (macocco_outlier_dims(h, s.percentile), f"{how} of h (Macocco et al. 2025)"),
           "unembedding": (macocco_outlier_dims(weight, s.percentile),
                           f"{how} of the output layer's weight rows (Macocco et al.'s unembedding outliers)")}
    acc = OutlierAccumulator(1, h.shape[-1])
    acc.update(h[None])
    out["argmax_share"] = (detect_outlier_dims(acc, "share", s.share_threshold)[0],
                           f"argmax/argmin share >= {s.share_threshold:g} (Luo et al. 2021 §2)")
    norm = loaded.layernorms.get(norm_key)
    if norm is None:
        out["layernorm"] = ([], f"no {norm_key!r} norm produces h in this model")
    else:
        one = LayerNormRule(k=rule.k, criterion=rule.criterion, layernorms=(norm_key,), min_layers=1)
        det = layernorm_outliers(layernorm_tensors({norm_key: norm}), one)
        why = det.unjudged.get(norm_key)
        out["layernorm"] = ([] if why else det.dims,
                            why or f"the {norm_key} norm's gain/bias outside mean ± {rule.k:g}σ "
                                   f"(criterion {rule.criterion}; Kovaleva et al. 2021)")
    return out


# ------------------------------------------------------------------------------------------- the job
def _plot(rows: list[dict], path) -> None:
    """Two bar panels, one bar per condition: Macocco's ρ(corpus, prediction frequency) and our ρ(frequency,
    mean log p)."""
    labels = [f"{r['rule']}:{r['condition']}" if r["rule"] != "model" else r["condition"] for r in rows]
    colors = ["tab:grey" if r["rule"] == "model" else "tab:red" if not r["condition"].startswith("random")
              else "tab:blue" for r in rows]
    fig = Figure(figsize=(2 * max(5, 0.5 * len(rows) + 2), 3.8))
    axes = fig.subplots(1, 2)
    for ax, key, ylabel in zip(axes, ("spearman", "logprob_spearman"), ("ρ(corpus, prediction freq.), predicted",
                                                                         "ρ(frequency, mean log p), all counted")):
        vals = [0.0 if r[key] != r[key] else r[key] for r in rows]
        err = [r.get(f"{key}_std") for r in rows]
        err = [0.0 if e is None or e != e else e for e in err]
        ax.bar(range(len(rows)), vals, yerr=err, color=colors)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_ylabel(ylabel)
    fig.suptitle("which logits predict frequent tokens (Macocco et al. 2025); red: outlier dims, blue: random",
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def check(ctx: EvalContext) -> FrequentTokensSettings:
    """Settings, the ``ln_rule`` group and every file (texts, ``count_files``) before any model is loaded."""
    s = ctx.settings(FrequentTokensSettings)
    ln_rule(ctx)
    check_texts(s)
    return s


def _batches(loaded: LoadedModel, s: FrequentTokensSettings, texts, max_length: int, seed: int):
    """``(batches, what is scored)`` by the objective and ``positions`` (see the module docstring)."""
    if not loaded.is_decoder:
        return (masked_batches(loaded.tokenizer, texts, max_length, s.batch_size, s.mlm_probability, seed),
                f"masked positions ({s.mlm_probability:g} of the tokens; the masked-LM analogue)")
    batches = next_token_batches(loaded.tokenizer, texts, max_length, s.batch_size)
    if s.positions == "every":
        return batches, "every next-token position (positions=every, ours)"
    batches, skipped = late_labels(batches, s.late_position)
    if all(int((b["labels"] != -100).sum()) == 0 for b in batches):
        raise ValueError(f"frequent_tokens: no sequence reaches token {s.late_position + 1} (positions=late): lower "
                         "frequent_tokens.late_position, set pack=true or a larger max_length, or positions=every")
    return batches, (f"token {s.late_position} of each sequence, scored against the next (Macocco et al.'s one "
                     f"late position per sequence; {skipped} sequence(s) too short left out)")


def run(ctx: EvalContext) -> AnalysisResult:
    s = ctx.prepared if isinstance(ctx.prepared, FrequentTokensSettings) else check(ctx)
    rule = ln_rule(ctx)
    loaded = shared_mlm(ctx)
    if not loaded.has_mlm_head:
        return skip_result("frequent_tokens", TITLE, f"{loaded.name}: {loaded.no_head_reason}.")
    texts, what, max_length, seed = scored_texts(ctx, s, loaded)
    batches, where = _batches(loaded, s, texts, max_length, seed)
    h, labels = last_vectors(loaded, batches)
    _, _, weight, bias, norm_key = output_layer(loaded)
    weight = weight.float().cpu()
    bias = None if bias is None else bias.float().cpu()
    enc = loaded.tokenizer(list(texts), truncation=True, max_length=max_length, return_special_tokens_mask=True)
    tokenized = SimpleNamespace(input_ids=enc["input_ids"], special_tokens_mask=enc["special_tokens_mask"])
    counts, counts_from = frequency_counts(ctx, s, tokenized, weight.shape[0])
    freqs = torch.from_numpy(np.asarray(counts[: weight.shape[0]], dtype=np.int64))
    sets = outlier_sets(loaded, h, weight, s, rule, norm_key)
    rows = score_conditions(h, labels, weight, bias, {k: v[0] for k, v in sets.items()}, freqs,
                            n_random=s.n_random, seed=seed, min_count=s.min_count)
    protocol = "masked" if not loaded.is_decoder else s.positions
    for r in rows:
        r["objective"], r["positions"] = loaded.objective, protocol
    fig = ctx.out_dir / "frequent_tokens.png" if ctx.plots else None
    if fig is not None:
        _plot(rows, fig)
    md = [TITLE,
          f"h = the vector entering the output layer at {rows[0]['n_positions']} positions — {where} — of {what}; "
          "logits hWᵀ + b split over dims S: **only** = h_S W_Sᵀ (Macocco et al.'s h[:, S] W[S, :]), **without** = "
          f"the model minus that term; random_* = as many random dims avoiding S and both Macocco sets "
          f"({s.n_random} draws, mean ± std); **bias** = the output layer's bias alone. Macocco et al.'s "
          "`lin_coeff`: over the tokens a condition predicts at least once, ρ and slope of prediction frequency "
          f"on corpus frequency ({counts_from}); # predicted = distinct predicted tokens. Ours beside it: "
          f"ρ(frequency, mean log p) over all {rows[0]['n_tokens_counted']} tokens counted >= {s.min_count} times.",
          "\n".join(f"- **{k}**: dims {', '.join(map(str, v[0])) or 'none'} — {v[1]}" for k, v in sets.items()),
          md_table(["rule", "condition", "# dims", "KL(full‖cond)", "top-1", "# predicted", "ρ (predicted)", "slope",
                    "ρ(freq, mean log p)"],
                   [[r["rule"], r["condition"], r["n_dims"], _pm(r, "kl"), _pm(r, "top1"), _pm(r, "n_tokens"),
                     _pm(r, "spearman") + ("" if r["lin_status"] == "ok" else f" ({r['lin_status']})"), _pm(r, "slope"),
                     _pm(r, "logprob_spearman")] for r in rows]),
          "![Spearman per condition](frequent_tokens.png)"]
    summary = {"dims": {k: v[0] for k, v in sets.items()}, "counts_from": counts_from, "positions": protocol,
               "spearman": {f"{r['rule']}:{r['condition']}": r["spearman"] for r in rows},
               "slope": {f"{r['rule']}:{r['condition']}": r["slope"] for r in rows},
               "logprob_spearman": {f"{r['rule']}:{r['condition']}": r["logprob_spearman"] for r in rows}}
    return AnalysisResult("frequent_tokens", rows, "\n\n".join(md), [fig], summary)


def _pm(r: dict, k: str) -> str:
    v, sd = r.get(k), r.get(f"{k}_std")
    if v is None or v != v:
        return "–"
    fmt = "{:.3g}" if k == "slope" else "{:.1f}" if k == "n_tokens" else "{:.3f}"
    if k == "n_tokens" and sd is None:
        fmt = "{:.0f}"
    return fmt.format(v) + (" ± " + fmt.format(sd) if sd is not None and sd == sd else "")
