"""``evaluate.py`` analysis ``ablation``: disable LayerNorm outlier dims, measure masked-LM quality.

Kovaleva et al. (2021), "BERT Busters: Outlier Dimensions that Disrupt Transformers": zeroing the gain and
bias of a handful of LayerNorm dims that are outliers in many layers (BERT-base: 308 and 381) wrecks the
masked-LM, while zeroing as many random dims does almost nothing.  This module reproduces their
"Random vs Outliers" comparison for any encoder with an MLM head:

* **outlier dims** — 3σ dims (gain or bias, :func:`analysis.layernorm.sigma_outlier_dims`) of every layer's
  *output* LayerNorm that are flagged in at least ``min_layers`` of them
  (:func:`analysis.layernorm.shared_outlier_dims`); ``min_layers`` defaults to ⌈L/3⌉, Puccetti et al.'s
  "4 of 12 layers" (Kovaleva et al. ask for dims that are outliers in "many" layers, without a number);
* **disabled** — gain and bias of those dims set to 0 in the chosen LayerNorms (``output``; optionally also
  ``attention_output`` and ``embeddings``), by :func:`zero_layernorm_dims`, which restores the weights after;
* **controls** — the intact model; the same number of random dims (``n_random`` seeded draws,
  :func:`analysis.outliers.random_dims`, never including the outlier dims), reported as mean ± std; and
  the dims the user names (``ablation.dims``);
* **score** — masked-LM loss, perplexity (exp of the mean loss per masked token) and top-1 accuracy on
  held-out text.  Evaluation masking is deterministic: 15% of the non-special tokens, seeded per batch,
  ALL replaced by ``<mask>`` (no 80/10/10 split: at evaluation the random/unchanged replacements only add
  noise), and the same masked batches are scored under every condition.

The weight surgery (:func:`zero_layernorm_dims`), the masking (:func:`masked_batches`) and the scoring loop
(:func:`mlm_scores`) are plain functions, usable without evaluate.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from analysis.layernorm import flagged_from_rows, layernorm_stats, shared_outlier_dims
from analysis.outliers import random_dims
from evaluation.mlm_loading import LoadedModel, analysis_texts, check_texts, shared_mlm
from evaluation.registry import AnalysisResult, EvalContext, register

LAYERNORM_KINDS = ("embeddings", "attention_output", "output")
TITLE = "## LayerNorm outlier ablation (Kovaleva et al. 2021, BERT Busters)"


# --------------------------------------------------------------------------------------- LayerNorm choice
def layernorm_kind(key: str) -> str:
    """``embeddings`` / ``attention_output`` / ``output`` of a :func:`~evaluation.mlm_loading.layernorm_map` key."""
    return "embeddings" if key == "embeddings" else key.rsplit(".", 1)[-1]


def select_layernorms(layernorms: Mapping[str, nn.LayerNorm], kinds: Iterable[str]) -> dict[str, nn.LayerNorm]:
    """The LayerNorms of the given kinds (``output``, ``attention_output``, ``embeddings``), in model order."""
    kinds = [str(k) for k in kinds]
    bad = sorted(set(kinds) - set(LAYERNORM_KINDS))
    if bad or not kinds:
        raise ValueError(f"unknown LayerNorm kind(s) {bad or kinds}: choose from {list(LAYERNORM_KINDS)}, "
                         "e.g. ablation.layernorms=[output,attention_output]")
    return {k: m for k, m in layernorms.items() if layernorm_kind(k) in kinds}


@dataclass
class LayerNormOutliers:
    """Result of :func:`layernorm_outlier_dims`."""

    dims: list[int]  # dims flagged in >= min_layers LayerNorms, most layers first
    counts: dict[int, int]  # dim -> number of LayerNorms flagging it
    flagged: dict[str, list[int]]  # LayerNorm -> its 3σ dims (gain ∪ bias)
    min_layers: int
    n_layernorms: int
    k: float
    params: tuple[str, ...]

    def describe(self) -> str:
        shown = ", ".join(f"{d} ({self.counts[d]}/{self.n_layernorms})" for d in self.dims) or "none"
        return (f"{'/'.join(self.params)} outside mean ± {self.k:g}σ in ≥ {self.min_layers} of "
                f"{self.n_layernorms} LayerNorms: {shown}")


def layernorm_outlier_dims(layernorms: Mapping[str, nn.LayerNorm], kinds: Sequence[str] = ("output",),
                           k: float = 3.0, params: Sequence[str] = ("gain", "bias"), min_layers: int | None = None,
                           min_layers_fraction: float = 1 / 3) -> LayerNormOutliers:
    """The model's LayerNorm outlier dims (Kovaleva et al. 2021; Puccetti et al. 2022).

    Per LayerNorm of ``kinds``: the 3σ dims of its gain and/or bias (:func:`analysis.layernorm.layernorm_stats`);
    a dim is an outlier of the model when at least ``min_layers`` LayerNorms flag it
    (:func:`analysis.layernorm.shared_outlier_dims`).  ``min_layers=None`` uses
    ``ceil(min_layers_fraction * n_layernorms)`` (default 1/3: Puccetti et al.'s 4 of 12, at least 1).
    """
    params = tuple(str(p) for p in params)
    if not params or set(params) - {"gain", "bias"}:
        raise ValueError(f"detect.params must be a non-empty subset of [gain, bias], got {list(params)}")
    if not 0 < min_layers_fraction <= 1:
        raise ValueError(f"detect.min_layers_fraction must be in (0, 1], got {min_layers_fraction}")
    lns = select_layernorms(layernorms, kinds)
    rows = layernorm_stats({n: (m.weight, m.bias) for n, m in lns.items()}, k=k)
    flagged: dict[str, list[int]] = {n: [] for n in lns}
    for p in params:
        for name, dims in flagged_from_rows(rows, p).items():
            flagged[name] += [d for d in dims if d not in flagged[name]]
    n = len(lns)
    ml = int(min_layers) if min_layers is not None else max(1, math.ceil(min_layers_fraction * n - 1e-9))
    counts = shared_outlier_dims(flagged, ml)
    return LayerNormOutliers(list(counts), counts, flagged, ml, n, float(k), params)


# ------------------------------------------------------------------------------------------ weight surgery
@contextmanager
def zero_layernorm_dims(layernorms: Mapping[str, nn.LayerNorm], dims: Iterable[int] | Mapping[str, Iterable[int]]):
    """Temporarily set gain AND bias of ``dims`` to 0 in exactly the given LayerNorms (Kovaleva et al. 2021).

    Parameters
    ----------
    layernorms : Mapping[str, nn.LayerNorm]
        The LayerNorms to touch (e.g. :func:`select_layernorms`); no other parameter is changed.
    dims : Iterable[int] or Mapping[str, Iterable[int]]
        The same dims in every LayerNorm, or per LayerNorm name (names missing from the mapping: none).

    Notes
    -----
    The original entries are copied before zeroing and written back on exit, also when the body raises,
    so the model is bit-for-bit what it was before.
    """
    per = {}
    for name, ln in layernorms.items():
        ds = dims.get(name, ()) if isinstance(dims, Mapping) else dims
        ds = sorted({int(d) for d in ds})
        size = ln.weight.shape[0]
        if ds and (ds[0] < 0 or ds[-1] >= size):
            raise ValueError(f"dims {ds} out of range for LayerNorm {name!r} of size {size}")
        per[name] = ds
    saved: list[tuple[Tensor, Tensor, Tensor]] = []
    try:
        with torch.no_grad():
            for name, ln in layernorms.items():
                if not per[name]:
                    continue
                idx = torch.tensor(per[name], dtype=torch.long, device=ln.weight.device)
                for p in (ln.weight, ln.bias):
                    if p is not None:
                        saved.append((p, idx, p[idx].clone()))
                        p[idx] = 0
        yield
    finally:
        with torch.no_grad():
            for p, idx, old in reversed(saved):
                p[idx] = old


# ----------------------------------------------------------------------------------------- masked text
def pack_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[str]:
    """Join consecutive texts (with a space) into pieces of at most ``max_length`` tokens incl. specials.

    MLM pretraining sees blocks of running text, not isolated sentences; packing held-out sentences the
    same way gives the model its usual context.  A text longer than the budget stays alone (and is
    truncated when tokenized).
    """
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    lengths = [len(x) for x in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    out, cur, used = [], [], 0
    for text, n in zip(texts, lengths):
        extra = n + (1 if cur else 0)  # the joining space may add a token
        if cur and used + extra > budget:
            out.append(" ".join(cur))
            cur, used = [], 0
            extra = n
        cur.append(text)
        used += extra
    if cur:
        out.append(" ".join(cur))
    return out


def masked_batches(tokenizer, texts: Sequence[str], max_length: int = 128, batch_size: int = 16,
                   mlm_probability: float = 0.15, seed: int = 0) -> list[dict[str, Tensor]]:
    """Deterministically masked evaluation batches: ``{"input_ids", "attention_mask", "labels"}``.

    Each non-special, non-pad token is selected with probability ``mlm_probability`` and replaced by
    ``<mask>`` (``mask_replace_prob=1``: no random/unchanged replacements at evaluation); labels are -100
    elsewhere.  The masking is :class:`datamodules.masking.DeterministicMLMCollator` (transformers'
    collator seeded per batch from ``seed`` and the text indices), so the same call gives the same masks.
    """
    from datamodules.masking import DeterministicMLMCollator

    if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no mask or pad token: masked-LM evaluation is impossible")
    ids = tokenizer(list(texts), truncation=True, max_length=int(max_length))["input_ids"]
    collate = DeterministicMLMCollator(tokenizer, mlm_probability=mlm_probability, seed=seed,
                                       mask_replace_prob=1.0, random_replace_prob=0.0)
    batches = []
    for start in range(0, len(ids), batch_size):
        rows = ids[start:start + batch_size]
        t = max(len(r) for r in rows)
        examples = [{"index": start + i,
                     "input_ids": torch.tensor(r + [tokenizer.pad_token_id] * (t - len(r))),
                     "attention_mask": torch.tensor([1] * len(r) + [0] * (t - len(r)))} for i, r in enumerate(rows)]
        batches.append(collate(examples))
    return batches


@torch.inference_mode()
def mlm_scores(forward_logits: Callable[[Tensor, Tensor], Tensor], batches: Iterable[Mapping[str, Tensor]]) -> dict:
    r"""Masked-LM loss, perplexity and top-1 accuracy over the masked positions of ``batches``.

    .. math:: \text{loss} = \frac{1}{N}\sum_{(b,t):\,y_{bt}\ne-100} -\log p(y_{bt}\mid x_b),\qquad
              \text{ppl} = e^{\text{loss}},\qquad \text{top1} = \frac1N\#\{\arg\max_v p(v\mid x_b)_t = y_{bt}\}

    Parameters
    ----------
    forward_logits : callable ``(input_ids, attention_mask) -> logits [B, T, V]``
    batches : iterable of ``{"input_ids", "attention_mask", "labels"}``

    Returns
    -------
    dict with ``loss``, ``ppl``, ``top1``, ``n_masked``.
    """
    total, correct, n = 0.0, 0, 0
    for b in batches:
        logits = forward_logits(b["input_ids"], b["attention_mask"])
        labels = b["labels"].to(logits.device)
        sel = labels != -100
        lg, y = logits[sel].float(), labels[sel]
        total += float(F.cross_entropy(lg, y, reduction="sum").double())
        correct += int((lg.argmax(-1) == y).sum())
        n += int(sel.sum())
    if n == 0:
        raise ValueError("no masked token to score: the texts are too short or mlm_probability is 0")
    loss = total / n
    return {"loss": loss, "ppl": math.exp(loss) if loss < 700 else math.inf, "top1": correct / n, "n_masked": n}


@torch.inference_mode()
def fill_mask(loaded: LoadedModel, text: str, top_k: int = 5) -> list[tuple[str, float]]:
    """Top-``k`` predictions (token, probability) for the first ``{mask}`` (or mask token) in ``text``."""
    tok = loaded.tokenizer
    text = text.replace("{mask}", tok.mask_token)
    enc = tok(text, return_tensors="pt", truncation=True, max_length=loaded.max_length)
    where = (enc["input_ids"][0] == tok.mask_token_id).nonzero().flatten()
    if where.numel() == 0:
        raise ValueError(f"example sentence {text!r} has no {{mask}} placeholder")
    logits = loaded.forward(enc["input_ids"], enc["attention_mask"]).logits[0, int(where[0])]
    probs, ids = logits.float().softmax(-1).topk(top_k)
    return [(tok.decode([int(i)]).strip(), float(p)) for p, i in zip(probs, ids)]


# ------------------------------------------------------------------------------------------- experiment
@dataclass
class AblationOutcome:
    rows: list[dict]
    examples: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    n_masked: int = 0


ROW_FIELDS = ("condition", "draw", "n_dims", "dims", "layernorms", "loss", "ppl", "top1",
              "loss_std", "ppl_std", "top1_std", "n_draws", "n_masked")
COLUMNS = list(ROW_FIELDS)  # evaluate.py writes this header even when the ablation is skipped


def _row(condition: str, dims: Sequence, kinds: Sequence[str], scores: Mapping, draw: int | None = None,
         std: Mapping | None = None, n_draws: int = 1) -> dict:
    """One CSV row; ``dims`` is a list of dims, or (random) a list of draws written ``a;b|c;d``."""
    std = std or {}
    nested = bool(dims) and isinstance(dims[0], (list, tuple))
    return {"condition": condition, "draw": draw, "n_dims": len(dims[0]) if nested else len(dims),
            "dims": "|".join(";".join(map(str, ds)) for ds in dims) if nested else ";".join(map(str, dims)),
            "layernorms": ";".join(kinds), "loss": scores["loss"], "ppl": scores["ppl"], "top1": scores["top1"],
            "loss_std": std.get("loss"), "ppl_std": std.get("ppl"), "top1_std": std.get("top1"),
            "n_draws": n_draws, "n_masked": scores["n_masked"]}


def run_ablation(loaded: LoadedModel, batches: Sequence[Mapping[str, Tensor]], kinds: Sequence[str] = ("output",),
                 outlier_dims: Sequence[int] = (), user_dims: Sequence[int] = (), n_random: int = 5, seed: int = 0,
                 example: str | None = None, top_k: int = 5) -> AblationOutcome:
    """Score ``batches`` intact, with the outlier dims, random dims and user dims disabled.

    Random control: ``n_random`` draws of ``len(outlier_dims)`` dims avoiding the outlier dims (if no
    outlier dims are given: ``len(user_dims)`` dims avoiding the user's), from one generator seeded with
    ``seed``.  Rows: ``intact``, ``outliers``, ``random`` (mean ± sample std over draws), one
    ``random_draw`` per draw, ``user`` (see :data:`ROW_FIELDS`).
    """
    if not loaded.has_mlm_head:
        raise ValueError(f"{loaded.name} has no masked-LM head: {loaded.no_head_reason}")
    lns = select_layernorms(loaded.layernorms, kinds)
    kinds = [str(k) for k in kinds]
    d = loaded.hidden_size
    outlier_dims, user_dims = [int(x) for x in outlier_dims], [int(x) for x in user_dims]
    for name, ds in (("outlier", outlier_dims), ("user", user_dims)):
        if any(not 0 <= x < d for x in ds):
            raise ValueError(f"{name} dims {ds} out of range for hidden size {d}")

    def logits(ids, mask):
        return loaded.forward(ids, mask).logits

    def score(dims: Sequence[int], tag: str) -> dict:
        with zero_layernorm_dims(lns, dims):
            s = mlm_scores(logits, batches)
            if example and tag not in out.examples:
                out.examples[tag] = fill_mask(loaded, example, top_k)
        return s

    out = AblationOutcome([])
    intact = score([], "intact")
    out.n_masked = intact["n_masked"]
    out.rows.append(_row("intact", [], kinds, intact))
    if outlier_dims:
        out.rows.append(_row("outliers", outlier_dims, kinds, score(outlier_dims, "outliers")))
    control = outlier_dims or user_dims
    if control and n_random > 0:
        gen = torch.Generator().manual_seed(int(seed))
        draws = [random_dims(d, len(control), exclude=control, generator=gen) for _ in range(n_random)]
        per = [score(ds, "random") for ds in draws]
        mean = {k: statistics.fmean(s[k] for s in per) for k in ("loss", "ppl", "top1")}
        std = {k: statistics.stdev(s[k] for s in per) if len(per) > 1 else 0.0 for k in ("loss", "ppl", "top1")}
        out.rows.append(_row("random", draws, kinds, {**mean, "n_masked": out.n_masked}, std=std, n_draws=len(per)))
        out.rows += [_row("random_draw", ds, kinds, s, draw=i) for i, (ds, s) in enumerate(zip(draws, per))]
    if user_dims:
        out.rows.append(_row("user", user_dims, kinds, score(user_dims, "user")))
    return out


# ------------------------------------------------------------------------------------------------ report
_LABELS = {"intact": "intact model", "outliers": "outlier dims disabled", "random": "random dims disabled",
           "user": "chosen dims disabled"}


def _fmt(x: float, digits: int = 3) -> str:
    return "inf" if x == math.inf else f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.3g}"


def ablation_markdown(outcome: AblationOutcome, notes: Sequence[str], example: str | None) -> str:
    lines = [TITLE, "", "| condition | # dims | dims | MLM loss | perplexity | top-1 acc. |",
             "|---|---|---|---|---|---|"]
    for r in outcome.rows:
        if r["condition"] == "random_draw":
            continue
        label = _LABELS[r["condition"]]
        if r["condition"] == "random":
            label += f" (mean ± std, {r['n_draws']} draws)"
        dims = "see CSV" if r["condition"] == "random" else (r["dims"].replace(";", ", ") or "–")
        vals = [(r["loss"], r["loss_std"]), (r["ppl"], r["ppl_std"]), (r["top1"], r["top1_std"])]
        cells = [_fmt(v) + ("" if s is None else f" ± {_fmt(s)}") for v, s in vals]
        lines.append(f"| {label} | {r['n_dims']} | {dims} | " + " | ".join(cells) + " |")
    lines += [""] + [f"- {n}" for n in notes]
    if example and outcome.examples:
        lines += ["", f"Fill in the blank: `{example}` (top-{len(next(iter(outcome.examples.values())))} "
                  "predictions; random: first draw)", "", "| condition | predictions |", "|---|---|"]
        for tag, preds in outcome.examples.items():
            lines.append(f"| {_LABELS[tag]} | " + ", ".join(f"`{t}` {p:.3g}" for t, p in preds) + " |")
    return "\n".join(lines) + "\n"


def skip_result(name: str, title: str, reason: str) -> AnalysisResult:
    """A one-line 'skipped' section (no rows) instead of a crash."""
    return AnalysisResult(name, [], f"{title}\n\nSkipped: {reason}\n", summary={"skipped": reason})


def cfg_get(cfg, key: str, default=None):
    from omegaconf import OmegaConf

    if cfg is None:
        return default
    v = OmegaConf.select(cfg if OmegaConf.is_config(cfg) else OmegaConf.create(dict(cfg)), key, default=None)
    return default if v is None else v


def detect_from_cfg(layernorms: Mapping[str, nn.LayerNorm], cfg) -> LayerNormOutliers:
    """:func:`layernorm_outlier_dims` with a section's ``detect`` settings (same defaults everywhere)."""
    return layernorm_outlier_dims(layernorms, kinds=list(cfg_get(cfg, "detect.layernorms", ["output"])),
                                  k=float(cfg_get(cfg, "detect.k", 3.0)),
                                  params=list(cfg_get(cfg, "detect.params", ["gain", "bias"])),
                                  min_layers=cfg_get(cfg, "detect.min_layers"),
                                  min_layers_fraction=float(cfg_get(cfg, "detect.min_layers_fraction", 1 / 3)))


def check_common(ctx: EvalContext, section: str) -> None:
    """Settings shared by ablation / attention_sinks / frequency, checked before any model is loaded."""
    cfg = ctx.cfg
    for key in ("layernorms", "detect.layernorms"):
        kinds = [str(k) for k in cfg_get(cfg, key, ["output"])]
        if not kinds or set(kinds) - set(LAYERNORM_KINDS):
            raise ValueError(f"{section}.{key}={kinds}: choose from {list(LAYERNORM_KINDS)}")
    params = [str(p) for p in cfg_get(cfg, "detect.params", ["gain", "bias"])]
    if not params or set(params) - {"gain", "bias"}:
        raise ValueError(f"{section}.detect.params={params}: a non-empty subset of [gain, bias]")
    check_texts(ctx)


def check(ctx: EvalContext) -> None:
    """Settings and files, before any encoding (called by evaluate.py)."""
    check_common(ctx, "ablation")
    p = float(cfg_get(ctx.cfg, "mlm_probability", 0.15))
    if not 0 < p < 1:
        raise ValueError(f"ablation.mlm_probability must be in (0, 1), got {p}")
    if int(cfg_get(ctx.cfg, "n_random", 5)) < 0:
        raise ValueError("ablation.n_random must be >= 0")
    example = cfg_get(ctx.cfg, "example")
    if example and "{mask}" not in str(example):
        raise ValueError(f"ablation.example must contain the placeholder {{mask}}: {example!r}")


@register("ablation")
def run(ctx: EvalContext) -> AnalysisResult:
    """Kovaleva et al.'s "Random vs Outliers" MLM comparison (settings: ``configs/ablation/default.yaml``)."""
    check(ctx)
    cfg = ctx.cfg
    loaded = shared_mlm(ctx)
    if not loaded.has_mlm_head:
        return skip_result("ablation", TITLE, f"{loaded.name}: {loaded.no_head_reason}.")
    kinds = [str(k) for k in cfg_get(cfg, "layernorms", ["output"])]
    select_layernorms(loaded.layernorms, kinds)  # validate before the slow part
    det = detect_from_cfg(loaded.layernorms, cfg)
    given = cfg_get(cfg, "outlier_dims")
    outliers = [int(x) for x in given] if given else det.dims
    user = [int(x) for x in cfg_get(cfg, "dims", [])]
    texts, what = analysis_texts(ctx, default_max=cfg_get(cfg, "max_sentences"))
    max_length = min(int(cfg_get(cfg, "max_length", 128)), loaded.max_length)
    if cfg_get(cfg, "pack", True):
        texts = pack_texts(loaded.tokenizer, texts, max_length)
    seed = int(cfg_get(cfg, "seed", ctx.seed))
    p = float(cfg_get(cfg, "mlm_probability", 0.15))
    batches = masked_batches(loaded.tokenizer, texts, max_length, int(cfg_get(cfg, "batch_size", 16)), p, seed)
    example = cfg_get(cfg, "example")
    out = run_ablation(loaded, batches, kinds, outliers, user, int(cfg_get(cfg, "n_random", 5)), seed, example,
                       int(cfg_get(cfg, "top_k", 5)))
    notes = [f"Model: {loaded.name}. LayerNorms zeroed (gain and bias): {', '.join(kinds)} "
             f"({len(select_layernorms(loaded.layernorms, kinds))} LayerNorms).",
             ("Outlier dims given by ablation.outlier_dims; detected: " if given else "Outlier dims: ")
             + det.describe() + ".",
             f"Text: {what}" + (f", packed into {len(texts)} sequences of ≤ {max_length} tokens"
                                if cfg_get(cfg, "pack", True) else "") + f"; {out.n_masked} masked tokens.",
             f"Masking: {p:.0%} of non-special tokens -> mask token (no 80/10/10), seed {seed}, identical "
             "positions in every condition. Random draws never include the outlier dims."]
    if not outliers:
        notes.append("No LayerNorm outlier dim was found, so there is no outlier condition"
                     + (" (random control matches the chosen dims)." if user else "."))
    by = {r["condition"]: r for r in out.rows}
    summary = {"outlier_dims": outliers, "intact_ppl": by["intact"]["ppl"],
               **({"outliers_ppl": by["outliers"]["ppl"]} if "outliers" in by else {}),
               **({"random_ppl_mean": by["random"]["ppl"]} if "random" in by else {}),
               **({"user_ppl": by["user"]["ppl"]} if "user" in by else {})}
    return AnalysisResult("ablation", out.rows, ablation_markdown(out, notes, example), summary=summary)
