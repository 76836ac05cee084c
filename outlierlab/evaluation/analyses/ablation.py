"""``evaluate.py`` analysis ``ablation``: disable LayerNorm outlier dims, measure masked-LM quality.

Kovaleva et al. (2021), "BERT Busters: Outlier Dimensions that Disrupt Transformers": zeroing the gain and bias of a few
LayerNorm dims that are outliers in many layers (BERT-base: 308 and 381) wrecks the masked LM, while as many random dims
do almost nothing.  Their "Random vs Outliers" comparison, for any model with an LM head:

* **outlier dims** — by THE rule, ``layernorm_rule.layernorm_outliers`` with the ``ln_rule`` settings (default:
  output LayerNorms, gain AND bias outside mean ± 3σ, in more than a quarter of the layers — Kovaleva et al.'s
  criterion with Puccetti et al.'s layer count), the dims the monitor and the outliers analysis flag;
* **disabled** — those dims of the judged norms' outputs (or ``ablation.layernorms``) set to 0 by hooks at the
  norms' named sites (``models.hook_points``), bit for bit Kovaleva et al.'s surgery without touching a weight;
  or with ``ablation.mode=mean`` set to their mean over the scored tokens in the intact model, as Sun et al. (2024,
  "Massive Activations in Large Language Models") do (the ``mode`` column says which);
* **controls** — the intact model; ``n_random`` seeded draws of as many random dims (``outlier_dims.random_dims``,
  avoiding the outlier and user dims), mean ± std; the dims the user names (``ablation.dims``);
* **score** — with the model's own head: for encoders masked-LM loss, perplexity and top-1 on held-out text with
  deterministic masking (15% of non-special tokens, seeded, ALL ``<mask>``: no 80/10/10 at evaluation); for decoders
  the next-token loss (``scoring_batches.next_token_batches``); the ``objective`` column says which; the same
  batches under every condition;
* **pre-LN models** — the dims are zeroed in both per-layer norms and the final norm (``ln_rule.zeroed_kinds``;
  docs/fidelity.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from outlierlab.metrics.layernorm_rule import LayerNormRule
from outlierlab.metrics.outlier_dims import random_dims
from outlierlab.metrics.position_shares import bucket_columns
from outlierlab.evaluation.registry import AnalysisResult, EvalContext, scored_texts, shared_mlm, skip_result
from outlierlab.evaluation.analyses.ln_rule import check_common, detect_layernorm_outliers, zeroed_kinds
from outlierlab.metrics.scored_rows import mlm_scores
from outlierlab.datamodules.scoring_batches import masked_batches, next_token_batches
from outlierlab.models.lm_model import LoadedModel, fill_mask, predict_next
from outlierlab.configuration.analysis_settings import AblationSettings
from outlierlab.models.hook_points import attached, norm_site, site_means, site_table
from outlierlab.models.interventions import mean as set_to_mean, zero
from outlierlab.models.layernorms import layernorms_of_layers, select_layernorms
from outlierlab.utils.tables import md_table

#: Scores with the model's LM head: evaluate.py loads the encoder with it, once.
LM_HEAD = True

TITLE = "## LayerNorm outlier ablation (Kovaleva et al. 2021, BERT Busters)"


# ------------------------------------------------------------------------------------------- experiment
@dataclass
class AblationOutcome:
    rows: list[dict]
    examples: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    n_masked: int = 0
    #: the scores of every condition per position bucket (:data:`POSITION_FIELDS`): ``ablation_by_position.csv``
    by_position: list[dict] = field(default_factory=list)


ROW_FIELDS = ("condition", "draw", "n_dims", "dims", "layernorms", "layers", "objective", "loss", "ppl", "top1",
              "loss_std", "ppl_std", "top1_std", "n_draws", "n_masked", "mode")
#: How a disabled dim is set: ``zero`` (Kovaleva et al. 2021) or ``mean`` (its mean over the scored tokens in the
#: intact model; Sun et al. 2024).
MODES = ("zero", "mean")
COLUMNS = list(ROW_FIELDS)  # evaluate.py writes this header even when the ablation is skipped
#: ``ablation_by_position.csv``: each condition's scores at the scored tokens of one position bucket (1, 2-3, 4-7,
#: ...: :mod:`outlierlab.metrics.position_shares`), ``random`` the mean over the draws -- do the dims a model
#: uses to mark positions (docs/design.md, position marker) cost it most at the positions they mark?
POSITION_FIELDS = ("condition", "draw", "dims", "positions", "first_position", "last_position", "n_masked", "loss",
                   "top1")


def _row(condition: str, dims: Sequence, kinds: Sequence[str], scores: Mapping, draw: int | None = None,
         std: Mapping | None = None, n_draws: int = 1, objective: str = "masked_lm", layers: str = "",
         mode: str = "zero") -> dict:
    """One CSV row; ``dims`` is a list of dims, or (random) a list of draws written ``a;b|c;d``; ``layers``: where
    (``1;2``), empty for every layer."""
    std = std or {}
    nested = bool(dims) and isinstance(dims[0], (list, tuple))
    return {"condition": condition, "draw": draw, "n_dims": len(dims[0]) if nested else len(dims),
            "dims": "|".join(";".join(map(str, ds)) for ds in dims) if nested else ";".join(map(str, dims)),
            "layernorms": ";".join(kinds), "layers": layers, "objective": objective, "loss": scores["loss"], "ppl": scores["ppl"], "top1": scores["top1"],
            "loss_std": std.get("loss"), "ppl_std": std.get("ppl"), "top1_std": std.get("top1"),
            "n_draws": n_draws, "n_masked": scores["n_masked"], "mode": mode}


def _position_rows(condition: str, dims: Sequence[int], by_position: Mapping[int, Mapping],
                   draw: int | None = None) -> list[dict]:
    return [{"condition": condition, "draw": draw, "dims": ";".join(map(str, dims)), **bucket_columns(b),
             "n_masked": s["n_masked"], "loss": s["loss"], "top1": s["top1"]} for b, s in by_position.items()]


def run_ablation(loaded: LoadedModel, batches: Sequence[Mapping[str, Tensor]], kinds: Sequence[str],
                 outlier_dims: Sequence[int] = (), user_dims: Sequence[int] = (), *, n_random: int, seed: int,
                 example: str | None = None, top_k: int, layers: Sequence[int] | None = None,
                 mode: str = "zero") -> AblationOutcome:
    """Score ``batches`` intact, with the outlier dims, random dims and user dims disabled.

    Random control: ``n_random`` draws of ``len(outlier_dims)`` dims (else ``len(user_dims)``) avoiding both sets (they
    are under study), from one generator seeded with ``seed``.  Rows: ``intact``, ``outliers``, ``random`` (mean ±
    sample std), one ``random_draw`` per draw, ``user`` (``ROW_FIELDS``); the same per position bucket in
    ``by_position`` (``POSITION_FIELDS``).  ``n_random``, ``seed``, ``top_k`` are stated once, in
    ``configs/evaluate.yaml``.  ``batches`` hold ``labels`` aligned with the logits (``masked_batches`` or
    ``next_token_batches``; ``loaded.objective`` names which).  ``layers``: zero only in the ``kinds`` norms of these
    layers (None: every layer).  ``mode="zero"`` sets the dims to 0 at the norms' outputs (hooks), ``"mean"`` to their
    intact-model mean over the real tokens (one more forward; Sun et al. 2024).
    """
    if not loaded.has_mlm_head:
        raise ValueError(f"{loaded.name} has no LM head: {loaded.no_head_reason}")
    predict = predict_next if loaded.objective == "next_token" else fill_mask
    lns = select_layernorms(loaded.layernorms, kinds) if kinds else {}  # none: an unregistered family
    if layers is not None:
        lns = layernorms_of_layers(lns, layers)
    kinds, where = [str(k) for k in kinds], "" if layers is None else ";".join(str(int(x)) for x in layers)
    if mode not in MODES:
        raise ValueError(f"ablation mode {mode!r}: valid: {', '.join(MODES)}")
    table = site_table(loaded.model) if lns else {}
    sites = [norm_site(k) for k in lns]
    moved = [k for k, s in zip(lns, sites) if table[s].module is not lns[k]]
    if moved:  # the registry and the norm list are one list of modules; a mismatch would ablate elsewhere
        raise RuntimeError(f"the sites of norms {moved} are not those norms: outlierlab/models/hook_points.py and "
                           "outlierlab/models/layernorms.py disagree")
    d = loaded.hidden_size
    outlier_dims, user_dims = [int(x) for x in outlier_dims], [int(x) for x in user_dims]
    for name, ds in (("outlier", outlier_dims), ("user", user_dims)):
        if any(not 0 <= x < d for x in ds):
            raise ValueError(f"{name} dims {ds} out of range for hidden size {d}")

    def logits(ids, mask, rows):
        return loaded.forward(ids, mask, rows=rows).logits

    means = None
    if mode == "mean" and sites:
        means = site_means(loaded.model, sites, lambda b: logits(b["input_ids"], b["attention_mask"],
                                                                 b["labels"] != -100), batches, table)

    def hooks(dims: Sequence[int]) -> dict:
        if not dims or not sites:
            return {}
        fn = zero(dims) if mode == "zero" else set_to_mean(means, dims)
        return {site: fn for site in sites}

    def score(dims: Sequence[int], tag: str) -> dict:
        with attached(loaded.model, hooks(dims), table):
            s = mlm_scores(logits, batches, by_position=True)
            if example and tag not in out.examples:
                out.examples[tag] = predict(loaded, example, top_k)
        return s

    def record(condition: str, dims: Sequence[int]) -> dict:
        s = score(dims, condition)
        out.rows.append(_row(condition, dims, kinds, s, objective=loaded.objective, layers=where, mode=mode))
        out.by_position += _position_rows(condition, dims, s["by_position"])
        return s

    out = AblationOutcome([])
    intact = record("intact", [])
    out.n_masked = intact["n_masked"]
    if outlier_dims:
        record("outliers", outlier_dims)
    control = outlier_dims or user_dims
    if control and n_random > 0:
        gen = torch.Generator().manual_seed(int(seed))
        studied = {*outlier_dims, *user_dims}
        draws = [random_dims(d, len(control), exclude=studied, generator=gen) for _ in range(n_random)]
        per = [score(ds, "random") for ds in draws]
        mean = {k: statistics.fmean(s[k] for s in per) for k in ("loss", "ppl", "top1")}
        std = {k: statistics.stdev(s[k] for s in per) if len(per) > 1 else 0.0 for k in ("loss", "ppl", "top1")}
        out.rows.append(_row("random", draws, kinds, {**mean, "n_masked": out.n_masked}, std=std, n_draws=len(per),
                             objective=loaded.objective, layers=where, mode=mode))
        out.rows += [_row("random_draw", ds, kinds, s, draw=i, objective=loaded.objective, layers=where, mode=mode)
                     for i, (ds, s) in enumerate(zip(draws, per))]
        # the draws score the same tokens, so each bucket's mean is over the same n_masked
        out.by_position += _position_rows("random", [], {
            b: {"n_masked": c["n_masked"], **{k: statistics.fmean(p["by_position"][b][k] for p in per)
                                                for k in ("loss", "top1")}} for b, c in intact["by_position"].items()})
        for i, (ds, s) in enumerate(zip(draws, per)):
            out.by_position += _position_rows("random_draw", ds, s["by_position"], draw=i)
    if user_dims:
        record("user", user_dims)
    return out


# ------------------------------------------------------------------------------------------------ report
_LABELS = {"intact": "intact model", "outliers": "outlier dims disabled", "random": "random dims disabled",
           "user": "chosen dims disabled"}


def _fmt(x: float, digits: int = 3) -> str:
    return "inf" if x == math.inf else f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.3g}"


def ablation_markdown(outcome: AblationOutcome, notes: Sequence[str], example: str | None,
                      decoder: bool = False) -> str:
    loss = "next-token loss" if decoder else "MLM loss"
    table = []
    for r in outcome.rows:
        if r["condition"] == "random_draw":
            continue
        label = _LABELS[r["condition"]]
        if r["condition"] == "random":
            label += f" (mean ± std, {r['n_draws']} draws)"
        dims = "see CSV" if r["condition"] == "random" else (r["dims"].replace(";", ", ") or "–")
        vals = [(r["loss"], r["loss_std"]), (r["ppl"], r["ppl_std"]), (r["top1"], r["top1_std"])]
        table.append([label, r["n_dims"], dims, *(_fmt(v) + ("" if s is None else f" ± {_fmt(s)}") for v, s in vals)])
    lines = [TITLE, "", md_table(["condition", "# dims", "dims", loss, "perplexity", "top-1 acc."], table, cell=str)]
    lines += [""] + [f"- {n}" for n in notes]
    lines += _by_position_markdown(outcome.by_position, loss)
    if example and outcome.examples:
        what = "Next token after the text before `{mask}` in" if decoder else "Fill in the blank:"
        lines += ["", f"{what} `{example}` (top-{len(next(iter(outcome.examples.values())))} "
                  "predictions; random: first draw)", "",
                  md_table(["condition", "predictions"], [[_LABELS[tag], ", ".join(f"`{t}` {p:.3g}" for t, p in preds)]
                                                          for tag, preds in outcome.examples.items()], cell=str)]
    return "\n".join(lines) + "\n"


def _by_position_markdown(rows: Sequence[Mapping], loss: str) -> list[str]:
    """The rise of the loss when each set is disabled, per position bucket (``ablation_by_position.csv``)."""
    conditions = [c for c in ("outliers", "random", "user") if any(r["condition"] == c for r in rows)]
    if not conditions:
        return []
    at = {(r["condition"], r["positions"]): r for r in rows if r["condition"] != "random_draw"}
    table = [[r["positions"], r["n_masked"], _fmt(r["loss"]), *(f"{at[c, r['positions']]['loss'] - r['loss']:+.3f}"
                                                               for c in conditions)]
             for r in rows if r["condition"] == "intact"]
    return ["", f"By the position of the scored token ({loss} of the intact model, and how much each condition raises "
            "it; `ablation_by_position.csv`):", "",
            md_table(["positions", "# scored", "intact", *(f"Δ {_LABELS[c]}" for c in conditions)], table, cell=str)]


def check(ctx: EvalContext) -> LayerNormRule:
    """Settings and files, before any encoding (called by evaluate.py); returns the outlier rule.  The value
    ranges are checked when the settings are built (``outlierlab.configuration.analysis_settings.AblationSettings``)."""
    return check_common(ctx, ctx.settings(AblationSettings))


def run(ctx: EvalContext) -> AnalysisResult:
    """Kovaleva et al.'s "Random vs Outliers" MLM comparison (settings: ``configs/ablation/default.yaml``,
    the outlier rule: ``configs/ln_rule/``)."""
    s = ctx.settings(AblationSettings)
    rule = check_common(ctx, s)
    loaded = shared_mlm(ctx)
    if not loaded.has_mlm_head:
        return skip_result("ablation", TITLE, f"{loaded.name}: {loaded.no_head_reason}.")
    decoder = loaded.objective == "next_token"
    if loaded.family is None:  # unregistered model_type: no norms to zero, the intact score still comes out
        kinds, outliers, user, given, chosen, layers = [], [], [], None, {}, None
        found = loaded.family_note
    else:
        kinds = zeroed_kinds(s, rule, loaded.layernorms)
        chosen, layers = select_layernorms(loaded.layernorms, kinds), s.layers  # validated before the slow part
        if layers is not None:
            chosen = layernorms_of_layers(chosen, layers)
        det = detect_layernorm_outliers(loaded.layernorms, rule)
        given = s.outlier_dims
        outliers = list(given) if given else det.dims
        user = list(s.dims)
        found = det.describe()
    texts, what, max_length, seed = scored_texts(ctx, s, loaded)
    p = s.mlm_probability
    batches = (next_token_batches(loaded.tokenizer, texts, max_length, s.batch_size) if decoder
               else masked_batches(loaded.tokenizer, texts, max_length, s.batch_size, p, seed))
    out = run_ablation(loaded, batches, kinds, outliers, user, n_random=s.n_random, seed=seed, example=s.example,
                       top_k=s.top_k, layers=layers, mode=s.mode)
    n_lns = len(chosen)
    how = ("LayerNorms zeroed (gain and bias)" if s.mode == "zero" else
           "Dims set to their mean over the scored tokens in the intact model (Sun et al. 2024) at the output of the "
           "LayerNorms")
    notes = [f"Model: {loaded.name}. {how}: {', '.join(kinds) or 'none'} "
             + (f"in layer(s) {', '.join(map(str, layers))} " if layers is not None else "")
             + f"({n_lns} LayerNorms)" + (" — and the final norm before the LM head: no per-layer norm of a pre-LN "
                                        "or reordered-norm block normalises the stream it reads"
                                        if "final" in kinds and s.layernorms is None else "") + ".",
             ("Outlier dims given by ablation.outlier_dims; detected: " if given else "Outlier dims: ")
             + found + ".",
             f"Text: {what}" + (f", packed into {len(texts)} sequences of ≤ {max_length} tokens"
                                if s.pack else "") + f"; {out.n_masked} scored tokens.",
             ("Objective: next-token loss with the model's own LM head — every non-special token predicted from "
              "its left context (a decoder), identical batches in every condition." if decoder else
              f"Objective: masked-LM loss with the model's own head. Masking: {p:.0%} of non-special tokens -> "
              f"mask token (no 80/10/10), seed {seed}, identical positions in every condition.")
             + " Random draws never include the outlier dims nor the chosen ones."]
    if not outliers:
        notes.append("No LayerNorm outlier dim was found, so there is no outlier condition"
                     + (" (random control matches the chosen dims)." if user else "."))
    by = {r["condition"]: r for r in out.rows}
    summary = {"outlier_dims": outliers, "layernorm_outlier_dims": det.dims if loaded.family else [],
               "objective": loaded.objective, "intact_ppl": by["intact"]["ppl"],
               **({"mode": s.mode} if s.mode != "zero" else {}),
               **({"outliers_ppl": by["outliers"]["ppl"]} if "outliers" in by else {}),
               **({"random_ppl_mean": by["random"]["ppl"]} if "random" in by else {}),
               **({"user_ppl": by["user"]["ppl"]} if "user" in by else {})}
    return AnalysisResult("ablation", out.rows, ablation_markdown(out, notes, s.example, decoder), summary=summary,
                          tables={"ablation_by_position": (out.by_position, list(POSITION_FIELDS))})
