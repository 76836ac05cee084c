"""Long-format records of the outlier statistics, shared by the training monitors and post-hoc analysis.

The quantities themselves live in ``outlierlab.metrics.layernorm`` (3σ LayerNorm outliers and divergence from
initialisation; Kovaleva et al. 2021, Puccetti et al. 2022), ``outlierlab.metrics.outlier_stats`` (per-layer mean
vector and argmax/argmin share; Luo et al. 2021 §2) with ``outlierlab.metrics.outlier_dims`` (the outlier-dim
rule), ``outlierlab.metrics.activations`` (kurtosis, He et al. 2024; max/median, Sun et al. 2024),
``outlierlab.metrics.attention_mass`` (sink heads and entropy, Gu et al. 2025) and
``outlierlab.metrics.similarity`` (anisotropy; Ethayarajh 2019), ``outlierlab.metrics.rogue_dims`` (each dim's share of
the anisotropy; Timkey & van Schijndel 2021) and ``outlierlab.metrics.isoscore`` (IsoScore; Rudman et al. 2022).  This module only *calls* them and flattens the results into rows
``(step, name, statistic, dim, value)`` — the format of ``monitor/layernorm.csv`` and
``monitor/hidden_states.csv`` (see ``outlierlab.monitoring.history`` for the column meanings) —
so that the live callbacks and ``outlierlab.jobs.posthoc`` write identical numbers.

Pure functions: tensors (and a tokenizer object) in, rows and tensors out; no Lightning, no files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from outlierlab.metrics.layernorm import flagged_from_rows, layernorm_stats
from outlierlab.metrics.layernorm_rule import LayerNormRule, layernorm_outliers
from outlierlab.metrics.activations import ActivationAccumulator
from outlierlab.metrics.attention_mass import (SINK_THRESHOLD, attention_entropy, attention_row_mass, sink_head_share,
                                           special_key_masks, special_token_attention_mass)
from outlierlab.metrics.outlier_dims import detect_outlier_dims
from outlierlab.metrics.outlier_stats import OutlierAccumulator, valid_token_mask
from outlierlab.metrics.position_shares import PositionArgmaxCounts, token_positions
from outlierlab.metrics.isoscore import isoscore
from outlierlab.metrics.rogue_dims import cosine_contributions, share_defined, top_share
from outlierlab.metrics.similarity import anisotropy, paired_sentence_tokens, pairwise_cosine, sample_cross_sentence_pairs

__all__ = ["Row", "layernorm_snapshot", "layernorm_records", "tokenize_heldout", "hidden_state_records"]

#: One history row: (step, name, statistic, dim or None, value).
Row = tuple[int, str, str, "int | None", float]


# ---------------------------------------------------------------------------------------- LayerNorm
def layernorm_snapshot(layernorms: Mapping[str, nn.LayerNorm]) -> dict[str, tuple[Tensor, Tensor | None]]:
    """Detached float32 CPU copies of each LayerNorm's (gain, bias), keyed by name.

    ``layernorms`` is e.g. ``RobertaMaskedLM.named_layernorms()`` (``embeddings``,
    ``layer.{i}.attention_output``, ``layer.{i}.output``).
    """
    out = {}
    for name, ln in layernorms.items():
        # getattr: torch's RMSNorm has a gain but no ``bias`` attribute at all (LayerNorm's is None when absent)
        weight, bias = getattr(ln, "weight", None), getattr(ln, "bias", None)
        if weight is None:
            continue  # a norm without affine parameters: nothing to track
        b = None if bias is None else bias.detach().float().cpu().clone()
        out[name] = (weight.detach().float().cpu().clone(), b)
    return out


def layernorm_records(step: int, params: Mapping[str, tuple[Tensor | None, Tensor | None]],
                      initial: Mapping[str, tuple[Tensor, Tensor | None]] | None = None, top_k: int = 3,
                      vectors: bool = True, rule: LayerNormRule | Mapping | None = None) -> tuple[list[Row], dict]:
    """History rows for every LayerNorm at one step, via ``outlierlab.metrics.layernorm.layernorm_stats``.

    ``params``: ``{name: (gain [d] | None, bias [d] | None)}`` now (``outlierlab.models.layernorms.layernorm_tensors``;
    a norm without a gain gets no per-LayerNorm statistics, and the rule lists it as not judged); ``initial``: the same
    at initialisation (None: gain₀ = 1, bias₀ = 0); ``rule``: THE LayerNorm-outlier rule
    (``outlierlab.metrics.layernorm_rule.layernorm_outliers``; None: its defaults), whose k also sets the σ of the
    descriptive statistics; ``top_k``: dims of largest |z| written per LayerNorm whether flagged or not, to watch an
    outlier emerge before it crosses kσ; ``vectors``: also write every dim's gain and bias.

    Returns
    -------
    rows : list[Row]
        Statistics per LayerNorm name: ``gain_mean gain_std bias_mean bias_std n_gain_outliers n_bias_outliers`` (dim
        empty; ``bias_*`` rows only for a norm with a bias), ``gain_outlier`` / ``bias_outlier`` (dim = flagged dim,
        value = its gain/bias, strongest |z| first), ``top_gain_z`` / ``top_bias_z`` (the ``top_k`` dims of largest |z|,
        value = signed z-score), ``max_abs_gain_div`` / ``max_abs_bias_div`` (dim = the dim that moved most from init,
        value = |Δ|), ``gain`` / ``bias`` (every dim, if ``vectors``). ``rule_outlier`` (dim flagged by the rule in that
        LayerNorm, value = its gain, or bias for ``criterion=bias``).  Under name ``model``: ``min_layers``,
        ``n_outlier_dims`` and ``outlier_dim`` (dim, value = number of layers flagging it) — the rule's model-level
        dims.
    summary : dict
        ``stats`` (the ``layernorm_stats`` records), ``flagged`` ({"gain"|"bias": {name: dims}}, descriptive),
        ``outliers`` (the rule's ``LayerNormOutliers``), ``min_layers`` (int).
    """
    rule = LayerNormRule.from_mapping(rule)
    stats = layernorm_stats({n: p for n, p in params.items() if p[0] is not None}, initial, k=rule.k, top_k=top_k)
    rows: list[Row] = []
    for rec in stats:
        name = rec["name"]
        gain, bias = params[name]
        for part in ("gain", "bias"):
            vec = gain if part == "gain" else bias
            if vec is None:
                continue  # e.g. RMSNorm's bias: no rows rather than NaN means and a "0 outliers" that was never judged
            rows += [(step, name, f"{part}_mean", None, rec[f"{part}_mean"]),
                     (step, name, f"{part}_std", None, rec[f"{part}_std"]),
                     (step, name, f"n_{part}_outliers", None, rec[f"n_{part}_outliers"])]
            v = vec.detach().double().cpu()
            for d in flagged_from_rows([rec], part)[name]:
                rows.append((step, name, f"{part}_outlier", d, float(v[d])))
            top_dims = [int(x) for x in str(rec.get(f"top_{part}_dims", "")).split(";") if x != ""]
            top_z = [float(x) for x in str(rec.get(f"top_{part}_z", "")).split(";") if x != ""]
            rows += [(step, name, f"top_{part}_z", d, z) for d, z in zip(top_dims, top_z)]
            rows.append((step, name, f"max_abs_{part}_div", rec[f"argmax_abs_{part}_div"], rec[f"max_abs_{part}_div"]))
            if vectors:
                rows += [(step, name, part, d, x) for d, x in enumerate(v.tolist())]
    flagged = {p: flagged_from_rows(stats, p) for p in ("gain", "bias")}
    det = layernorm_outliers(params, rule)
    for name, dims in det.flagged.items():
        gain, bias = params[name]
        vec = (bias if rule.criterion == "bias" or gain is None else gain).detach().double().cpu()
        rows += [(step, name, "rule_outlier", d, float(vec[d])) for d in dims]
    rows.append((step, "model", "min_layers", None, det.min_layers))
    rows.append((step, "model", "n_outlier_dims", None, len(det.dims)))
    rows += [(step, "model", "outlier_dim", d, det.counts[d]) for d in det.dims]
    return rows, {"stats": stats, "flagged": flagged, "outliers": det, "min_layers": det.min_layers}


# ------------------------------------------------------------------------------------- hidden states
def tokenize_heldout(tokenizer, texts: Sequence[str], max_length: int) -> dict[str, Tensor]:
    """A fixed held-out batch from texts: ``input_ids``, ``attention_mask``, ``special_tokens_mask``.

    Uses the Hugging Face tokenizer's own padding, truncation and special-token mask; the
    special-token mask is what ``outlierlab.metrics.outlier_stats.valid_token_mask`` needs to leave ``<s>``,
    ``</s>`` and padding out of the statistics (Luo et al. 2021 §2).
    """
    if not texts:
        raise ValueError("the held-out batch needs at least one text")
    if getattr(tokenizer, "pad_token_id", 0) is None:
        # decoder tokenizers (GPT-2, Llama) have no pad token and the monitor must not give the caller's
        # tokenizer one: pad here, right-aligned, with attention 0 and special 1 so no statistic reads the pads
        enc = tokenizer(list(texts), truncation=True, max_length=int(max_length), return_special_tokens_mask=True)
        width = max(len(x) for x in enc["input_ids"])
        pad_id = getattr(tokenizer, "eos_token_id", None) or 0
        out = {"input_ids": [], "attention_mask": [], "special_tokens_mask": []}
        for ids, mask, special in zip(enc["input_ids"], enc["attention_mask"], enc["special_tokens_mask"]):
            n = width - len(ids)
            out["input_ids"].append(list(ids) + [pad_id] * n)
            out["attention_mask"].append(list(mask) + [0] * n)
            out["special_tokens_mask"].append(list(special) + [1] * n)
        return {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=int(max_length),
                    return_special_tokens_mask=True, return_tensors="pt")
    return {k: enc[k] for k in ("input_ids", "attention_mask", "special_tokens_mask")}


def jackknife_se_by_sentence(cosines: Tensor, sentence_a: Tensor, sentence_b: Tensor) -> Tensor:
    r"""Standard error of a mean pair cosine, by deleting one sentence at a time (Efron & Stein 1981's jackknife).

    With S sentences and θ₍ₖ₎ the mean over the pairs that do not involve sentence k,
    SE = √((S − 1)/S · Σₖ (θ₍ₖ₎ − θ̄)²), θ̄ = mean of the θ₍ₖ₎. Pairs drawn from a small batch share sentences
    (1,000 pairs from 32 sentences), so they are not independent and sd/√P understates the error.  ``cosines``
    ``[L, P]``; ``sentence_a``, ``sentence_b`` ``[P]``: the sentence of each pair's two tokens.  Returns ``[L]``
    float64, NaN with fewer than 3 sentences.
    """
    ids = torch.cat([sentence_a, sentence_b]).cpu().unique()
    n_layers = cosines.shape[0]
    if ids.numel() < 3:
        return torch.full((n_layers,), math.nan, dtype=torch.float64)
    c = cosines.double().cpu()
    involves = (sentence_a.cpu()[None, :] == ids[:, None]) | (sentence_b.cpu()[None, :] == ids[:, None])  # [S, P]
    keep = (~involves).double()
    counts = keep.sum(1)  # pairs left after deleting sentence k
    theta = (c @ keep.T) / counts  # [L, S]
    s = ids.numel()
    return torch.sqrt((s - 1) / s * ((theta - theta.mean(1, keepdim=True)) ** 2).sum(1))


def hidden_state_records(step: int, hidden: Tensor, attention_mask: Tensor,
                         special_tokens_mask: Tensor | None = None, top_k: int = 5, n_pairs: int = 1000,
                         seed: int = 0, vectors: bool = True, *, attentions: Tensor | None = None,
                         input_ids: Tensor | None = None, bos_token_id: int | None = None,
                         eos_token_id: int | None = None, inf_norms: Mapping[str, Tensor] | None = None,
                         sink_threshold: float = SINK_THRESHOLD) -> tuple[list[Row], dict]:
    """History rows for every layer's hidden states on one batch (Luo et al. 2021 §2, §4.1 and the modern
    outlier metrics of docs/design.md).

    ``hidden`` ``[L, B, T, d]`` comes from ``outlierlab.models.sites.monitored_forward`` (layer 0: the embedding
    output); only non-pad, non-special tokens count (``valid_token_mask``).  ``top_k`` dims of largest |mean| are
    written per layer; ``n_pairs`` cross-sentence token pairs (with replacement, seeded by ``seed``: the same pairs at
    every step) give the anisotropy; ``vectors`` also writes every dim's ``mean``.  ``attentions``
    ``[L-1, B, H, T, T]`` with ``input_ids`` and the ``<s>``/``</s>`` ids add the sink rows (Gu et al. 2025; ε =
    ``sink_threshold``); ``inf_norms`` ``{site: Tensor[L]}`` comes from ``outlierlab.models.sites.InfNormRecorder``.

    Returns
    -------
    rows : list[Row]
        Per layer name ``layer_{i}``: ``n_tokens``; ``argmax_share`` / ``argmin_share`` (dim = the dim holding most
        tokens' max/min, value = that share; signed values) and ``abs_argmax_share`` (the same for |x|);
        ``anisotropy``, the mean cosine of ``n_pairs`` token pairs from different sentences (Ethayarajh 2019;
        ``outlierlab.metrics.similarity.sample_cross_sentence_pairs``), with ``anisotropy_se`` (delete-one-sentence
        jackknife, ``jackknife_se_by_sentence``: the pairs reuse the batch's few sentences, so sd/√P would be too
        small) and ``n_anisotropy_pairs``; ``anisotropy_one_per_sentence`` (evaluate.py's protocol, one random
        token per sentence, sentences paired without replacement: 16 pairs on 32 sentences; Luo et al. §4.1);
        ``rogue_top1_share`` (dim = the largest contribution CC_i to the anisotropy, value = its share) and
        ``rogue_top3_share`` (Timkey & van Schijndel 2021, ``outlierlab.metrics.rogue_dims``; NaN where the
        anisotropy is within 2 standard errors of 0); ``isoscore`` (Rudman et al. 2022); ``kurtosis`` (He et al.
        2024); ``max_median`` (He et al. 2024; Sun et al. 2024); ``max_abs`` (dim, the largest |x|) and
        ``max_abs_token_id`` (its token, with ``input_ids``); ``top_abs_mean`` (dim, mean; largest |mean| first);
        ``outlier_dim`` (``outlierlab.metrics.outlier_dims.detect_outlier_dims``, value = the larger share);
        ``mean`` (every dim); for layers ≥ 1 with ``inf_norms``: ``inf_norm_<site>`` (Bondarenko et al. 2023);
        with ``attentions``: ``sink_share_bos`` / ``sink_share_eos`` (share of heads with mean mass > ε on
        ``<s>`` / ``</s>``), ``attn_entropy`` (mean over heads, nats), ``attn_entropy_head`` (dim = head) and
        ``attn_row_mass`` (mean total attention weight of a query row: 1 for softmax, < 1 under clipped softmax).
        Under name ``model``: ``pooled_argmin_share`` / ``pooled_argmax_share`` (dim, value; Luo et al. §2's
        pooled share over layers 1..L-1, ``outlierlab.metrics.outlier_stats.pooled_share``).  Per layer and
        position bucket that holds tokens (0, 1, 2–3, 4–7, ...; ``outlierlab.metrics.position_shares``):
        ``abs_argmax_share_pos_<first>-<last>`` (``_pos_1`` for the one-position bucket; dim = the layer's
        ``abs_argmax_share`` dim, value = its share among the bucket's tokens): is the dominant dimension
        positional? (Its all-token share then follows the batch's sentence lengths.)
    summary : dict
        ``mean`` Tensor[L, d], ``layers`` (``OutlierAccumulator.summary`` merged with
        ``ActivationAccumulator.summary``), ``anisotropy`` Tensor[L], ``outliers`` list[list[int]], ``pooled``
        {"argmin"|"argmax": (dim, share)}, ``inf_norms``, ``sinks`` ({"bos", "eos", "entropy"}: Tensor[L-1, H]) or
        None, ``position_shares`` (``PositionArgmaxCounts.rows``).
    """
    if hidden.ndim != 4:
        raise ValueError(f"hidden must be [L, B, T, d], got {tuple(hidden.shape)}")
    n_layers, _, _, dim = hidden.shape
    valid = valid_token_mask(attention_mask, special_tokens_mask).to(hidden.device)
    acc = OutlierAccumulator(n_layers, dim)
    acc.update(hidden, mask=valid)
    act = ActivationAccumulator(n_layers, dim)
    tokens = hidden[:, valid]  # [L, N, d]
    act.update(tokens)
    layers = [{**o, **a} for o, a in zip(acc.summary(top_k=top_k), act.summary())]
    by_position = PositionArgmaxCounts(n_layers, dim)
    positions = token_positions(attention_mask, valid)
    for i in range(n_layers):
        by_position.update(i, tokens[i], positions)
    position_shares = by_position.rows()
    outliers = detect_outlier_dims(acc)
    share = torch.maximum(acc.argmax_share(), acc.argmin_share())
    pairs = _anisotropy_stats(tokens, valid.nonzero()[:, 0], n_pairs, seed)
    iso = isoscore(tokens).cpu() if tokens.shape[1] >= 2 else torch.full((n_layers,), math.nan, dtype=torch.float64)
    # id of every valid token, in the order of `tokens`
    token_ids = None if input_ids is None else input_ids.to(valid.device)[valid]
    pooled = {w: acc.pooled_share(w) for w in ("argmin", "argmax")} if n_layers > 1 else {}
    sinks = None
    if attentions is not None and input_ids is not None and bos_token_id is not None and eos_token_id is not None:
        sinks = _sink_stats(attentions, input_ids, attention_mask, bos_token_id, eos_token_id)
    mean = acc.mean()
    rows: list[Row] = []
    for i, s in enumerate(layers):
        rows += _layer_rows(step, i, s, pairs, float(iso[i]), token_ids, inf_norms, sinks, sink_threshold)
        rows += [(step, f"layer_{i}", "outlier_dim", d, float(share[i, d])) for d in outliers[i]]
        if vectors:
            rows += [(step, f"layer_{i}", "mean", d, x) for d, x in enumerate(mean[i].tolist())]
    rows += [(step, f"layer_{r['layer']}", f"abs_argmax_share_pos_{r['positions']}", r["layer_dim"],
              r["layer_dim_share"]) for r in position_shares]
    for w, (d, v) in pooled.items():
        rows.append((step, "model", f"pooled_{w}_share", d, v))
    return rows, {"mean": mean, "layers": layers, "anisotropy": pairs["anisotropy"],
                  "anisotropy_se": pairs["anisotropy_se"], "anisotropy_one_per_sentence": pairs["one_per_sentence"],
                  "rogue_top1_share": pairs["share1"],
                  "rogue_top3_share": pairs["share3"], "isoscore": iso, "outliers": outliers, "pooled": pooled,
                  "inf_norms": dict(inf_norms or {}), "sinks": sinks, "sink_threshold": sink_threshold,
                  "position_shares": position_shares}


def _anisotropy_stats(tokens: Tensor, sentence_ids: Tensor, n_pairs: int, seed: int) -> dict:
    """The anisotropy block of ``hidden_state_records`` (NaN, 0 pairs and no rogue dim with < 2 sentences):
    ``anisotropy`` / ``anisotropy_se`` / ``n_pairs`` on ``n_pairs`` cross-sentence token pairs, ``one_per_sentence``
    (evaluate.py's protocol), ``share1`` / ``share3`` / ``top_dim`` (rogue dims of the same pairs)."""
    n_layers, dim = tokens.shape[0], tokens.shape[-1]
    nan = torch.full((n_layers,), math.nan, dtype=torch.float64)
    out = {"anisotropy": nan, "anisotropy_se": nan, "one_per_sentence": nan, "n_pairs": 0, "share1": nan,
           "share3": nan, "top_dim": [None] * n_layers}
    if sentence_ids.unique().numel() < 2:
        return out
    a, b = paired_sentence_tokens(sentence_ids, generator=seed)
    out["one_per_sentence"] = anisotropy(tokens[:, a.to(tokens.device)], tokens[:, b.to(tokens.device)]).double().cpu()
    a, b = sample_cross_sentence_pairs(sentence_ids, n_pairs, generator=seed)
    va, vb = tokens[:, a.to(tokens.device)], tokens[:, b.to(tokens.device)]
    cc = cosine_contributions(va, vb).cpu()  # [L, d], sums to the anisotropy
    defined = share_defined(va, vb)  # a share of an anisotropy within 2 SE of 0 is noise: NaN
    out.update(anisotropy=anisotropy(va, vb).double().cpu(), n_pairs=int(a.numel()),
               anisotropy_se=jackknife_se_by_sentence(pairwise_cosine(va, vb).double().cpu(), sentence_ids[a],
                                                      sentence_ids[b]),
               share1=torch.where(defined, top_share(cc, 1), nan),
               share3=torch.where(defined, top_share(cc, min(3, dim)), nan), top_dim=cc.argmax(-1).tolist())
    return out


def _sink_stats(attentions: Tensor, input_ids: Tensor, attention_mask: Tensor, bos_token_id: int,
                eos_token_id: int) -> dict[str, Tensor]:
    """Per block and head: attention mass on ``<s>`` / ``</s>`` (Gu et al. 2025), entropy and row mass."""
    keys = special_key_masks(input_ids, bos_token_id, eos_token_id, attention_mask)
    am = attention_mask.bool().to(attentions.device)
    mass = special_token_attention_mass(attentions, {k: keys[k] for k in ("bos", "eos")}, am)
    return {**mass, "entropy": attention_entropy(attentions, am), "row_mass": attention_row_mass(attentions, am)}


def _layer_rows(step: int, i: int, s: dict, pairs: dict, iso: float, token_ids: Tensor | None,
                inf_norms: Mapping[str, Tensor] | None, sinks: dict | None, sink_threshold: float) -> list[Row]:
    """The scalar rows of hidden-state layer ``i`` (``s``: its outlier and activation summary)."""
    name = f"layer_{i}"
    aniso = float(pairs["anisotropy"][i])
    rows: list[Row] = [
        (step, name, "n_tokens", None, s["n_tokens"]),
        (step, name, "argmax_share", s["argmax_dim"], s["argmax_share"]),
        (step, name, "argmin_share", s["argmin_dim"], s["argmin_share"]),
        (step, name, "abs_argmax_share", s["abs_argmax_dim"], s["abs_argmax_share"]),
        (step, name, "anisotropy", None, aniso),
        (step, name, "anisotropy_se", None, float(pairs["anisotropy_se"][i])),
        (step, name, "n_anisotropy_pairs", None, pairs["n_pairs"]),
        (step, name, "anisotropy_one_per_sentence", None, float(pairs["one_per_sentence"][i])),
        (step, name, "rogue_top1_share", pairs["top_dim"][i], float(pairs["share1"][i])),
        (step, name, "rogue_top3_share", None, float(pairs["share3"][i])),
        (step, name, "isoscore", None, iso),
        (step, name, "kurtosis", None, s["kurtosis"]),
        (step, name, "max_median", None, s["max_median"]),
        (step, name, "max_abs", s["max_abs_dim"], s["max_abs"])]
    if token_ids is not None:
        rows.append((step, name, "max_abs_token_id", None, int(token_ids[s["max_abs_token"]])))
    for site, v in (inf_norms or {}).items():
        if i >= 1 and not math.isnan(float(v[i])):
            rows.append((step, name, f"inf_norm_{site}", None, float(v[i])))
    if sinks is not None and i >= 1:
        rows += [(step, name, "sink_share_bos", None, float(sink_head_share(sinks["bos"][i - 1], sink_threshold))),
                 (step, name, "sink_share_eos", None, float(sink_head_share(sinks["eos"][i - 1], sink_threshold))),
                 (step, name, "attn_entropy", None, float(sinks["entropy"][i - 1].mean())),
                 (step, name, "attn_row_mass", None, float(sinks["row_mass"][i - 1].mean()))]
        rows += [(step, name, "attn_entropy_head", h, float(e)) for h, e in enumerate(sinks["entropy"][i - 1])]
    rows += [(step, name, "top_abs_mean", d, v) for d, v in zip(s["top_dims"], s["top_values"])]
    return rows
