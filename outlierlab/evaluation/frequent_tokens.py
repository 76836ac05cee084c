"""``evaluate.py`` analysis ``frequent_tokens``: do the last layer's outlier dims implement "predict a frequent
token"?  (Macocco et al. 2025, "Outlier dimensions favor frequent tokens in language models"; shown there for
decoders, here for any model with its own LM head — masked positions of an MLM, every position of a decoder.)

At the scored positions (encoders: deterministic 15% masking as the ablation; decoders: next token) the vector
h that enters the output layer (the MLM head's transformed vector, a decoder's final-normed residual) is
captured, and the logits ``hW^T + b`` are split over a set of dims S (:func:`outlierlab.analysis.frequent_tokens.split_logits`):

* **S** by three rules — ``macocco`` (theirs: median |h_d| above the 99th percentile of all |h|,
  :func:`~outlierlab.analysis.frequent_tokens.macocco_outlier_dims`), ``argmax_share`` (Luo et al.'s rule on h,
  :func:`outlierlab.analysis.outlier_dims.detect_outlier_dims`) and ``layernorm`` (THE LayerNorm rule,
  ``ln_rule`` k and criterion, on the norm that produces h: the MLM head's / a decoder's final norm);
* **conditions** — ``full`` (the model), ``only`` (h_S W_S^T: the dims alone), ``without`` (the model minus
  their term), the same two for ``n_random`` draws of |S| random dims (mean ± std), and ``bias`` (the output
  layer's bias alone, when it has one: the head's own unigram prior);
* **per condition** — KL(full ‖ condition), entropy, top-1 accuracy against the true token, and Spearman ρ
  between a token's corpus frequency and how often it is the top-1 prediction (``spearman``) and its mean
  log-probability (``logprob_spearman``: does the condition *rank* tokens by frequency)
  (:func:`~outlierlab.analysis.frequent_tokens.frequency_spearman`).  Frequencies as the ``frequency`` analysis counts them
  (``frequent_tokens.counts_from``: our runs' pretraining corpus, else the evaluated text, said so).
"""

from __future__ import annotations

import statistics
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import numpy as np
import torch
from torch import Tensor, nn

from outlierlab.analysis.frequent_tokens import ConditionStats, frequency_spearman, macocco_outlier_dims, split_logits
from outlierlab.analysis.layernorm_rule import LayerNormRule, layernorm_outliers
from outlierlab.analysis.outlier_dims import detect_outlier_dims, random_dims
from outlierlab.analysis.outlier_stats import OutlierAccumulator
from outlierlab.evaluation.common import ln_rule, skip_result
from outlierlab.evaluation.frequency import frequency_counts
from outlierlab.evaluation.masked_lm import masked_batches, pack_texts
from outlierlab.evaluation.mlm_loading import LoadedModel, analysis_texts, check_texts, shared_mlm
from outlierlab.evaluation.next_token import next_token_batches
from outlierlab.evaluation.registry import AnalysisResult, EvalContext, register
from outlierlab.evaluation.settings import FrequentTokensSettings, load_settings
from outlierlab.models.families import lm_head
from outlierlab.models.layernorms import layernorm_tensors
from outlierlab.reports.evaluation_report import md_table

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TITLE = "## Last-layer outlier dims and the frequent-token heuristic (Macocco et al. 2025)"
COLUMNS = ["rule", "condition", "n_dims", "dims", "kl", "entropy", "top1", "spearman", "logprob_spearman", "kl_std",
           "entropy_std", "top1_std", "spearman_std", "logprob_spearman_std", "n_draws", "n_positions",
           "n_tokens_correlated", "objective"]
METRICS = ("kl", "entropy", "top1", "spearman", "logprob_spearman")
RULES = ("macocco", "argmax_share", "layernorm")


# ------------------------------------------------------------------------------------- the output layer
def output_layer(loaded: LoadedModel) -> tuple[nn.Module, bool, Tensor, Tensor | None, str]:
    """``(module, hook_output, W [V, d], b [V] or None, norm key)``: where h is read (the module's output when
    ``hook_output``, else its input), the output layer's weight and bias, and the key of the norm producing h
    in ``loaded.layernorms`` ("head" for an MLM head, "final" for a pre-LN decoder)."""
    model = loaded.model
    norm_key = "final" if loaded.is_decoder else "head"
    if loaded.kind == "outlierlab":  # our LMHead: dense -> GELU -> layer_norm -> F.linear(tied embeddings, bias)
        return (model.lm_head.layer_norm, True, model.roberta.embeddings.word_embeddings.weight.detach(),
                model.lm_head.bias.detach(), norm_key)
    head = lm_head(model)
    if head is None or getattr(head, "weight", None) is None:
        raise ValueError(f"{loaded.name}: no output layer with a weight matrix to split")
    bias = getattr(head, "bias", None)
    return head, False, head.weight.detach(), None if bias is None else bias.detach(), norm_key


@contextmanager
def _capture(module: nn.Module, output: bool, store: list):
    def hook(_m, args, out):
        store.append((out if output else args[0]).detach())

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.inference_mode()
def last_vectors(loaded: LoadedModel, batches) -> tuple[Tensor, Tensor]:
    """h at every scored position (labels != -100) and those labels: ``([N, d] float32, [N])``."""
    module, output, *_ = output_layer(loaded)
    hs, ys = [], []
    for b in batches:
        store: list[Tensor] = []
        with _capture(module, output, store):
            loaded.forward(b["input_ids"], b["attention_mask"])
        h = store[-1].float().cpu()
        labels = b["labels"]
        if h.shape[:2] == labels.shape:  # [B, T, d]: every position went through the head
            sel = labels != -100
            hs.append(h[sel])
            ys.append(labels[sel])
        else:  # our model at evaluation computes all positions: never reached, kept as a guard
            raise ValueError(f"unexpected output-layer input shape {tuple(h.shape)} for labels {tuple(labels.shape)}")
    if not hs or sum(x.shape[0] for x in hs) == 0:
        raise ValueError("no scored position: the texts are too short or mlm_probability is 0")
    return torch.cat(hs), torch.cat(ys)


# ------------------------------------------------------------------------------------------- the dims
def outlier_sets(loaded: LoadedModel, h: Tensor, s: FrequentTokensSettings, rule: LayerNormRule,
                 norm_key: str) -> dict[str, tuple[list[int], str]]:
    """``{rule: (dims, how)}`` for :data:`RULES` (a rule that cannot judge gives ``[]`` and says why)."""
    out = {"macocco": (macocco_outlier_dims(h, s.percentile),
                       f"median |h_d| > the {s.percentile:g}th percentile of all |h| (Macocco et al. 2025)")}
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


# --------------------------------------------------------------------------------------- the conditions
def score_conditions(h: Tensor, labels: Tensor, weight: Tensor, bias: Tensor | None, sets: dict[str, list[int]],
                     freqs: Tensor, *, n_random: int, seed: int, min_count: int, chunk: int = 512) -> list[dict]:
    """Rows of :data:`COLUMNS` (without ``objective``) for ``full``, ``bias``, and per rule ``only``/``without``
    and their random controls."""
    vocab, d = weight.shape
    gen = torch.Generator().manual_seed(int(seed))
    conds: dict[tuple[str, str], list[int] | None] = {("model", "full"): None}
    draws: dict[str, list[list[int]]] = {}
    for name, dims in sets.items():
        if dims:
            conds[(name, "only")] = conds[(name, "without")] = dims
            draws[name] = [random_dims(d, len(dims), exclude=dims, generator=gen) for _ in range(n_random)]
    stats: dict[tuple, ConditionStats] = {}
    keys = [("model", "full", -1)] + ([("model", "bias", -1)] if bias is not None else [])
    for name in draws:
        keys += [(name, "only", -1), (name, "without", -1)]
        keys += [(name, f"random_{c}", i) for i in range(len(draws[name])) for c in ("only", "without")]
    for key in keys:
        stats[key] = ConditionStats(vocab)
    for start in range(0, h.shape[0], chunk):
        hc, yc = h[start:start + chunk].to(weight), labels[start:start + chunk]
        full = hc @ weight.T + (bias if bias is not None else 0)
        stats[("model", "full", -1)].update(full, full, yc)
        if bias is not None:
            stats[("model", "bias", -1)].update(bias.expand_as(full), full, yc)
        for name, dims in sets.items():
            if not dims:
                continue
            only, rest = split_logits(hc, weight, dims, bias)
            stats[(name, "only", -1)].update(only, full, yc)
            stats[(name, "without", -1)].update(rest, full, yc)
            for i, rd in enumerate(draws[name]):
                only, rest = split_logits(hc, weight, rd, bias)
                stats[(name, "random_only", i)].update(only, full, yc)
                stats[(name, "random_without", i)].update(rest, full, yc)
    n_corr = int((freqs >= min_count).sum())

    def metrics(st: ConditionStats) -> dict:
        r = st.result()
        return {"kl": r["kl"], "entropy": r["entropy"], "top1": r["top1"], "n_positions": r["n_positions"],
                "spearman": frequency_spearman(freqs, r["top1_counts"], min_count),
                "logprob_spearman": frequency_spearman(freqs, r["mean_logprob"], min_count)}

    rows = []
    for (name, cond, i), st in stats.items():
        if i >= 0:
            continue
        dims = sets.get(name, [])
        rows.append({"rule": name, "condition": cond, "n_dims": len(dims) if name != "model" else 0,
                     "dims": ";".join(map(str, dims)) if name != "model" else "", **metrics(st),
                     "n_draws": 1, "n_tokens_correlated": n_corr})
    for name, ds in draws.items():
        for cond in ("only", "without"):
            per = [metrics(stats[(name, f"random_{cond}", i)]) for i in range(len(ds))]
            if not per:
                continue
            row = {"rule": name, "condition": f"random_{cond}", "n_dims": len(ds[0]),
                   "dims": "|".join(";".join(map(str, x)) for x in ds), "n_draws": len(per),
                   "n_positions": per[0]["n_positions"], "n_tokens_correlated": n_corr}
            for k in METRICS:
                vals = [p[k] for p in per if p[k] == p[k]]
                row[k] = statistics.fmean(vals) if vals else float("nan")
                row[f"{k}_std"] = statistics.stdev(vals) if len(vals) > 1 else float("nan")
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------- the job
def _plot(rows: list[dict], path) -> None:
    """Two bar panels, one bar per condition: ρ(frequency, top-1 count) and ρ(frequency, mean log p)."""
    labels = [f"{r['rule']}:{r['condition']}" if r["rule"] != "model" else r["condition"] for r in rows]
    colors = ["tab:grey" if r["rule"] == "model" else "tab:red" if not r["condition"].startswith("random")
              else "tab:blue" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(2 * max(5, 0.5 * len(rows) + 2), 3.8))
    for ax, key, ylabel in zip(axes, ("spearman", "logprob_spearman"), ("ρ(frequency, top-1 count)",
                                                                         "ρ(frequency, mean log p)")):
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
    fig.savefig(path, dpi=120)
    plt.close(fig)


def check(ctx: EvalContext) -> FrequentTokensSettings:
    """Settings, the ``ln_rule`` group and every file (texts, ``count_files``) before any model is loaded."""
    s = load_settings(FrequentTokensSettings, ctx.cfg)
    ln_rule(ctx)
    check_texts(s)
    for f in (s.count_files or ()) if s.counts_from == "files" else ():
        if not Path(str(f)).expanduser().is_file():
            raise FileNotFoundError(f"frequent_tokens.count_files: file not found: {f}")
    return s


@register("frequent_tokens")
def run(ctx: EvalContext) -> AnalysisResult:
    s = ctx.prepared if isinstance(ctx.prepared, FrequentTokensSettings) else check(ctx)
    rule = ln_rule(ctx)
    loaded = shared_mlm(ctx)
    if not loaded.has_mlm_head:
        return skip_result("frequent_tokens", TITLE, f"{loaded.name}: {loaded.no_head_reason}.")
    texts, what = analysis_texts(ctx, s)
    max_length = min(s.max_length, loaded.max_length)
    if s.pack:
        texts = pack_texts(loaded.tokenizer, texts, max_length)
    seed = s.seed if s.seed is not None else ctx.seed
    batches = (next_token_batches(loaded.tokenizer, texts, max_length, s.batch_size) if loaded.is_decoder
               else masked_batches(loaded.tokenizer, texts, max_length, s.batch_size, s.mlm_probability, seed))
    h, labels = last_vectors(loaded, batches)
    _, _, weight, bias, norm_key = output_layer(loaded)
    weight = weight.float().cpu()
    bias = None if bias is None else bias.float().cpu()
    enc = loaded.tokenizer(list(texts), truncation=True, max_length=max_length, return_special_tokens_mask=True)
    tokenized = SimpleNamespace(input_ids=enc["input_ids"], special_tokens_mask=enc["special_tokens_mask"])
    counts, counts_from = frequency_counts(ctx, s, tokenized, weight.shape[0])
    freqs = torch.from_numpy(np.asarray(counts[: weight.shape[0]], dtype=np.int64))
    sets = outlier_sets(loaded, h, s, rule, norm_key)
    rows = score_conditions(h, labels, weight, bias, {k: v[0] for k, v in sets.items()}, freqs,
                            n_random=s.n_random, seed=seed, min_count=s.min_count)
    for r in rows:
        r["objective"] = loaded.objective
    fig = ctx.out_dir / "frequent_tokens.png"
    _plot(rows, fig)
    where = "next-token positions" if loaded.is_decoder else f"masked positions ({s.mlm_probability:g} of the tokens)"
    md = [TITLE,
          f"h = the vector entering the output layer at {rows[0]['n_positions']} {where} of {what}; logits "
          "hWᵀ + b split over dims S: **only** = h_S W_Sᵀ (the dims alone, Macocco et al.'s h[:, S] W[S, :]), "
          "**without** = the model minus that term; random_* = as many random dims "
          f"({s.n_random} draws, mean ± std); **bias** = the output layer's bias alone. ρ = Spearman between a "
          f"token's frequency ({counts_from}) and how often it is the top-1 prediction (Macocco et al.; most tokens "
          "are never top-1 and tie at 0) or its mean log-probability (how the condition *ranks* tokens), over the "
          f"{rows[0]['n_tokens_correlated']} tokens counted >= {s.min_count} times.",
          "\n".join(f"- **{k}**: dims {', '.join(map(str, v[0])) or 'none'} — {v[1]}" for k, v in sets.items()),
          md_table(["rule", "condition", "# dims", "KL(full‖cond)", "entropy", "top-1", "ρ(freq, top-1 count)",
                    "ρ(freq, mean log p)"],
                   [[r["rule"], r["condition"], r["n_dims"], _pm(r, "kl"), _pm(r, "entropy"), _pm(r, "top1"),
                     _pm(r, "spearman"), _pm(r, "logprob_spearman")] for r in rows]),
          "![Spearman per condition](frequent_tokens.png)"]
    summary = {"dims": {k: v[0] for k, v in sets.items()}, "counts_from": counts_from,
               "spearman": {f"{r['rule']}:{r['condition']}": r["spearman"] for r in rows},
               "logprob_spearman": {f"{r['rule']}:{r['condition']}": r["logprob_spearman"] for r in rows}}
    return AnalysisResult("frequent_tokens", rows, "\n\n".join(md), [fig], summary)


def _pm(r: dict, k: str) -> str:
    v, sd = r.get(k), r.get(f"{k}_std")
    if v is None or v != v:
        return "–"
    return f"{v:.3f}" + (f" ± {sd:.3f}" if sd is not None and sd == sd else "")
