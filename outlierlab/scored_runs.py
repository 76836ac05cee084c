"""Scored runs on named sites: the model's loss per token with hooks changing its activations
(``ol.run_with_hooks``), and activation patching built on it (``ol.patch_sites``).

    run = ol.run_with_hooks(enc, texts, hooks={"blocks.1.ln_ffn": ol.interventions.mean(cache, dims=[77])})
    run.loss, run.tokens                                       # masked-LM / next-token loss, per scored token
    ol.patch_sites(enc, texts, shuffled)                       # activation patching: a row per site

Scored by the masked-LM loss on the fixed, seeded masks of the ablation analysis (decoders: the next-token loss);
the sites, the model resolution and the run itself: ``outlierlab.site_runs``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from outlierlab.models import interventions  # noqa: F401 - ol.interventions
from outlierlab.models.activation_cache import ActivationCache, CacheWriter
from outlierlab.monitoring import arguments
from outlierlab.site_runs import (as_loaded, cache_writer, execute_run, plain_batches, plan_run, run_length, run_meta,
                                  text_list, token_index)

__all__ = ["run_with_hooks", "patch_sites", "HookedRun", "interventions"]


@dataclass
class HookedRun:
    """What ``run_with_hooks`` returns.

    loss, top1 : the mean loss (nats) and top-1 accuracy over the scored tokens
    n_scored : how many tokens were scored
    objective : ``masked_lm`` (the masked tokens) or ``next_token`` (a decoder: every non-special next token)
    tokens : a pandas DataFrame, one row per scored token: ``text`` (its index in ``texts``), ``position`` (the
        masked token's position; a decoder's: the predicting token's, which predicts ``position + 1``), ``target``
        (the token id to predict), ``token`` (its string), ``loss``, ``correct``
    cache : the sites asked for with ``cache=`` (``outlierlab.models.activation_cache.ActivationCache``), of the
        scored inputs (the masked ones), after the hooks; else None
    logits : with ``keep_logits=True``, ``[n_scored, V]`` float32 in the order of ``tokens``
    """

    loss: float
    top1: float
    n_scored: int
    objective: str
    tokens: Any
    cache: ActivationCache | None = None
    logits: torch.Tensor | None = None

    def by_position(self):
        """The mean loss and top-1 per position (a DataFrame indexed by ``position``, with ``n_scored``)."""
        g = self.tokens.groupby("position")
        return g.agg(loss=("loss", "mean"), top1=("correct", "mean"), n_scored=("loss", "size"))


def _scored_batches(loaded, texts: list[str], masks_from: list[str] | None, length: int, batch_size: int,
                    mlm_probability: float, seed: int) -> list[dict]:
    """The ablation's scoring batches, masked as ``masked_batches`` masks ``texts`` (or ``masks_from``)."""
    from outlierlab.datamodules.scoring_batches import masked_batches, next_token_batches

    tok = loaded.tokenizer
    if loaded.objective == "next_token":
        if masks_from is not None:
            raise ValueError(f"masks_from= places the masks of a masked LM; {loaded.name} is scored on every next "
                             "token")
        return next_token_batches(tok, texts, length, batch_size)
    if masks_from is None:
        return masked_batches(tok, texts, length, batch_size, mlm_probability, seed)
    if len(masks_from) != len(texts):
        raise ValueError(f"masks_from has {len(masks_from)} texts and texts {len(texts)}: give one per text")
    masked = masked_batches(tok, masks_from, length, batch_size, mlm_probability, seed)
    plain = plain_batches(tok, texts, length, batch_size)
    out = []
    for i, (m, p) in enumerate(zip(masked, plain)):
        here, there = p["attention_mask"].sum(1), m["attention_mask"].sum(1)
        if not torch.equal(here, there):
            b = int((here != there).nonzero()[0])
            raise ValueError(f"masks_from: text {i * batch_size + b} has {int(here[b])} tokens and its masks_from text "
                             f"{int(there[b])}; masks are placed on texts of as many tokens")
        where = m["labels"] != -100
        ids = p["input_ids"].clone()
        out.append({"input_ids": ids.masked_fill(where, tok.mask_token_id), "attention_mask": p["attention_mask"],
                    "labels": torch.where(where, ids, torch.full_like(ids, -100))})
    return out


def run_with_hooks(model: Any, texts: Sequence[str], hooks: Mapping[str, Callable] | None = None, *,
                   cache: Sequence[str] | None = None, to: str | os.PathLike | None = None, dtype: str = "float32",
                   masks_from: Sequence[str] | None = None, tokenizer: Any = None, mlm_probability: float | None = None,
                   seed: int = 0, batch_size: int | None = None, max_length: int | None = None,
                   keep_logits: bool = False) -> HookedRun:
    """The model's loss on ``texts``, per token, with ``hooks`` changing its activations on the way.

    Scored as the ablation analysis scores: a masked LM on fixed, seeded masks (``mlm_probability`` of the
    non-special tokens replaced by the mask token, no 80/10/10, drawn from ``seed`` and the texts' indices), so runs
    with and without hooks score the same tokens; a decoder on every non-special next token.  The ablation packs its
    sentences first: pass ``outlierlab.datamodules.scoring_batches.pack_texts(tokenizer, texts, 128)`` to match it.

    Parameters
    ----------
    hooks : ``{site: fn}``; ``fn(activation, point)`` returns the new activation (or None: unchanged), ``point``
        the ``outlierlab.models.hook_points.HookPoint`` (``name``, ``layer``, ``batch``, ``texts``,
        ``attention_mask``); a list of functions: each in turn.  Ready ones: ``outlierlab.models.interventions``
        (``ol.interventions.zero / mean / clip / scale / quantize / patch``)
    cache, to, dtype : also cache these sites of this run (after the hooks), as ``run_with_cache`` does
    masks_from : texts whose masks to use (text ``i``'s masked positions on text ``i``, of as many tokens)
    mlm_probability, batch_size, max_length : None: the ablation's (``configs/ablation``: 0.15, 16, 128 capped by the
        model); ``seed`` as the ablation's with ``ablation.seed=null`` (the global seed, 0)
    keep_logits : keep the scored rows' logits (``run.logits``)
    """
    from outlierlab.configuration.analysis_settings import AblationSettings

    loaded = as_loaded(model, tokenizer)
    if not loaded.has_mlm_head:
        raise ValueError(f"{loaded.name} has no LM head to score with: {loaded.no_head_reason} "
                         "(ol.run_with_cache reads its activations)")
    texts = text_list("texts", texts)
    masks_from = None if masks_from is None else text_list("masks_from", masks_from)
    defaults = AblationSettings()
    p = defaults.mlm_probability if mlm_probability is None else arguments.number("mlm_probability",
                                                                                  mlm_probability, 0.0, 1.0)
    batch_size = arguments.count("batch_size", defaults.batch_size if batch_size is None else batch_size, 1)
    length = min(defaults.max_length, loaded.max_length) if max_length is None else run_length(loaded, max_length)
    seed = arguments.count("seed", seed, None)
    keep_logits = arguments.flag("keep_logits", keep_logits)
    plan = plan_run(loaded, hooks, cache, default_all=False)
    batches = _scored_batches(loaded, texts, masks_from, length, batch_size, p, seed)
    writer = cache_writer(token_index(batches, labels=True), plan, to, dtype, texts,
                     run_meta(loaded, max_length=length, batch_size=batch_size, mlm_probability=p, seed=seed))
    scores = execute_run(loaded, batches, plan, writer, scored=True, keep_logits=keep_logits)
    return _run_result(loaded, scores, writer)


def _run_result(loaded, scores: dict, writer: CacheWriter | None) -> HookedRun:
    import pandas as pd

    cols = [torch.cat(c) for c in zip(*scores["rows"])] if scores["rows"] else [torch.zeros(0)] * 5
    n = int(cols[0].numel())
    if n == 0:
        raise ValueError("no token to score: the texts are too short or mlm_probability is 0")
    text, position, target, loss, correct = cols
    tokens = pd.DataFrame({"text": text.numpy(), "position": position.numpy(), "target": target.numpy(),
                           "token": loaded.tokenizer.convert_ids_to_tokens(target.tolist()),
                           "loss": loss.numpy(), "correct": correct.numpy()})
    return HookedRun(scores["total"] / n, scores["correct"] / n, n, loaded.objective, tokens,
                     None if writer is None else writer.finish(),
                     torch.cat(scores["logits"]) if scores["logits"] else None)

# ------------------------------------------------------------------------------------------ patching
def patch_sites(model: Any, texts: Sequence[str], source: Sequence[str], sites: Sequence[str] | None = None,
          dims: Sequence[int] | None = None, positions: Sequence[int] | None = None, by: str = "site", *,
          tokenizer: Any = None, **scoring: Any):
    """Activation patching: the loss of ``texts`` with one site at a time replaced by its activation on
    ``source`` (Vig et al. 2020; Meng et al. 2022; Heimersheim & Nanda 2024, "How to use and interpret activation
    patching"), as a pandas DataFrame.

    Text ``i`` of ``source`` is patched into text ``i`` of ``texts`` token by token (as many tokens), both scored on
    ``texts``' masks.  A corrupted source into clean texts asks what the corruption destroys (noising); swapped, what
    restores the clean loss (denoising).

    Parameters
    ----------
    sites : names or globs; None: every site but the attention patterns
    dims, positions : patch only these hidden dims / token positions (``outlierlab.models.interventions.patch``)
    by : ``site``: one row per site; ``position``: one row per site and scored position
    scoring : ``mlm_probability``, ``seed``, ``batch_size``, ``max_length`` of ``run_with_hooks``

    Returns
    -------
    pandas.DataFrame
        ``site``, ``layer`` (the block; 0: the embeddings; empty: the final norms), (``position``,) ``n_scored``,
        ``loss`` (patched), ``loss_base`` (``texts`` unpatched), ``loss_source`` (``source`` on the same masks),
        ``effect`` = ``loss - loss_base``, ``share`` = ``effect / (loss_source - loss_base)`` (NaN where the source
        costs nothing), and ``intervention``.
    """
    import numpy as np
    import pandas as pd

    from outlierlab.models.hook_points import resolve_sites, site_table

    if by not in ("site", "position"):
        raise ValueError(f"by={by!r}: pass 'site' (a row per site) or 'position' (a row per site and position)")
    unknown = sorted(set(scoring) - {"mlm_probability", "seed", "batch_size", "max_length"})
    if unknown:
        raise TypeError(f"patch_sites got unknown argument(s) {', '.join(unknown)}; valid: model, texts, source, sites, "
                        "dims, positions, by, tokenizer, mlm_probability, seed, batch_size, max_length")
    loaded = as_loaded(model, tokenizer)
    texts, source = text_list("texts", texts), text_list("source", source)
    if len(source) != len(texts):
        raise ValueError(f"source has {len(source)} texts and texts {len(texts)}: give one source per text")
    table = site_table(loaded.model)
    chosen = resolve_sites(table, sites, "sites", default=lambda s: s.layout == "tokens")
    masks = None if loaded.objective == "next_token" else texts
    base = run_with_hooks(loaded, texts, **scoring)
    src = run_with_hooks(loaded, source, cache=chosen, masks_from=masks, **scoring)
    rows = []
    for name in chosen:
        fn = interventions.patch(src.cache, dims, positions)
        run = run_with_hooks(loaded, texts, hooks={name: fn}, **scoring)
        common = {"site": name, "layer": table[name].layer}
        if by == "site":
            rows.append({**common, "n_scored": run.n_scored, "loss": run.loss, "loss_base": base.loss,
                         "loss_source": src.loss})
            continue
        per = pd.DataFrame({"position": base.tokens.position, "loss": run.tokens.loss, "loss_base": base.tokens.loss,
                            "loss_source": src.tokens.loss})
        for pos, g in per.groupby("position"):
            rows.append({**common, "position": int(pos), "n_scored": len(g), "loss": g.loss.mean(),
                         "loss_base": g.loss_base.mean(), "loss_source": g.loss_source.mean()})
    out = pd.DataFrame(rows)
    out["layer"] = out["layer"].astype("Int64")
    out["effect"] = out["loss"] - out["loss_base"]
    damage = out["loss_source"] - out["loss_base"]
    out["share"] = np.where(damage != 0, out["effect"] / damage.where(damage != 0, 1.0), np.nan)
    out["intervention"] = repr(interventions.patch(src.cache, dims, positions))
    return out
