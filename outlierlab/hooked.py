"""Named sites from Python: every activation of any supported model by one name, cached to memory or disk,
changed by hooks, patched from another run.

    import outlierlab as ol
    enc = ol.load_encoder("outputs/train/RUN")                 # or any model ol.load_encoder takes
    ol.sites(enc)                                              # ['embed', 'ln_embed', 'blocks.1.attn.q', ...]
    cache = ol.run_with_cache(enc, texts, sites=["blocks.*.resid"], to="disk")
    cache["blocks.3.resid"]                                    # [N tokens, d]; cache.text_index, cache.positions
    run = ol.run_with_hooks(enc, texts, hooks={"blocks.1.ln_ffn": ol.interventions.mean(cache, dims=[77])})
    run.loss, run.tokens                                       # masked-LM / next-token loss, per scored token
    ol.patch_sites(enc, texts, shuffled)                       # activation patching: a row per site

The names, the tensor each one is and its shape: ``outlierlab.models.hook_points`` (docs/sites.md).  Like
TransformerLens (Nanda & Bloom 2022) -- ``run_with_cache``, ``run_with_hooks``, hooks ``fn(activation, hook)`` -- but
for the models of this project (RoBERTa, BERT, DeBERTa, ModernBERT, our own encoders; decoders too), scored by
the masked-LM loss on the fixed, seeded masks of the ablation analysis (decoders: the next-token loss), with caches
that stream to memory-mapped files.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from outlierlab.models import interventions  # noqa: F401 - ol.interventions
from outlierlab.models.activation_cache import ActivationCache, CacheWriter, TokenIndex, to_rows
from outlierlab.monitoring import arguments

__all__ = ["sites", "run_with_cache", "run_with_hooks", "patch_sites", "HookedRun", "interventions"]


# ---------------------------------------------------------------------------------------------- the model
def _subject(model: Any, tokenizer: Any = None):
    """``model`` as a ``outlierlab.models.lm_model.LoadedModel`` (with its LM head where it has one): what
    ``outlierlab.api.load_encoder`` returns, a ``LoadedModel``, or a model in memory with its ``tokenizer=`` (ours:
    ``RobertaMaskedLM`` / ``RobertaEncoder``; a transformers model, taken as ``ol.load_encoder(model, tokenizer=)``
    takes it)."""
    from torch import nn

    from outlierlab.models.encoder import RobertaEncoder, RobertaMaskedLM
    from outlierlab.models.lm_model import LoadedModel, load_mlm
    from outlierlab.models.loading import FrozenEncoder

    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, FrozenEncoder):
        if tokenizer is not None:
            raise TypeError("tokenizer= goes with a model in memory: a loaded encoder brings its own")
        return load_mlm(model)
    if isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model={str(model)!r} is a name: pass the loaded model, ol.load_encoder({str(model)!r})")
    if isinstance(model, (RobertaMaskedLM, RobertaEncoder)):
        if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
            raise TypeError(f"pass tokenizer= (the {type(model).__name__}'s Hugging Face tokenizer) with a model in "
                            "memory")
        return _ours(model, tokenizer)
    if isinstance(model, nn.Module):
        from outlierlab.api import load_encoder

        return load_mlm(load_encoder(model, tokenizer=tokenizer))
    raise TypeError(f"model is a {type(model).__name__}: pass what ol.load_encoder(...) returns, or a model in memory "
                    "with tokenizer=")


def _ours(model, tokenizer):
    """Our encoder in memory, put in eval mode (as ``ol.load_encoder`` does with a model in memory)."""
    from outlierlab.models.encoder import RobertaMaskedLM
    from outlierlab.models.hook_points import _model_family
    from outlierlab.models.lm_model import LoadedModel, layernorm_map

    model.eval()
    head = isinstance(model, RobertaMaskedLM)
    causal = bool(getattr(model.config, "causal", False))
    return LoadedModel(model, tokenizer, layernorm_map(model) if head else {}, "outlierlab",
                       f"{type(model).__name__} in memory", head,
                       "" if head else "a RobertaEncoder is the body without its LM head: pass the RobertaMaskedLM",
                       max_length=int(model.config.max_len), objective="next_token" if causal else "masked_lm",
                       family=_model_family(model))


def sites(model: Any, tokenizer: Any = None, hidden_states: bool = False) -> list[str]:
    """The names of every site of ``model``, in depth order: ``embed``, ``ln_embed``, per block
    ``blocks.{i}.attn.q|k|v|pattern|out``, ``blocks.{i}.ln_attn``, ``blocks.{i}.ffn.pre|post|out``,
    ``blocks.{i}.ln_ffn``, ``blocks.{i}.resid`` (blocks numbered from 1, as hidden states: ``blocks.{i}.resid`` is
    hidden state ``i``), ``ln_final``, ``ln_head``; a site the model lacks is absent.  Which tensor each one is, and
    its shape: ``outlierlab.models.hook_points``.

    ``model``: what ``outlierlab.api.load_encoder`` returns (its LM head's norm is ``ln_head``), or a model in
    memory with its ``tokenizer=`` (ours, or a transformers model).

    ``hidden_states=True``: the ``L + 1`` sites that are ``output_hidden_states``, indexed as the hidden states and
    as the layers of evaluate.py's tables and the monitors' ``layer_<i>``: ``embed``, ``blocks.{i}.resid``, and for
    the last of a model with a final norm ``ln_final``."""
    from outlierlab.models.hook_points import hidden_state_sites, site_names

    model = _subject(model, tokenizer).model
    return hidden_state_sites(model) if arguments.flag("hidden_states", hidden_states) else site_names(model)


# --------------------------------------------------------------------------------------------- the runs
@dataclass
class _Plan:
    """What one run asks of the model: the sites it hooks and records, and so which forward it needs."""

    table: dict
    hooks: dict
    record: list[str]

    @property
    def attentions(self) -> bool:  # a pattern exists only on the explicit (eager) attention path
        return any(self.table[n].layout == "pattern" for n in [*self.hooks, *self.record])

    @property
    def head(self) -> bool:  # the LM head's norm is reached only when the head runs on every position
        return "ln_head" in self.hooks or "ln_head" in self.record


def _plan(loaded, hooks: Mapping | None, record: Sequence[str] | None, default_all: bool) -> _Plan:
    from outlierlab.models.hook_points import resolve_sites, site_table

    table = site_table(loaded.model)
    if hooks is not None and not isinstance(hooks, Mapping):
        raise TypeError(f"hooks is a {type(hooks).__name__}: pass {{site: fn}}, e.g. "
                        "{'blocks.1.resid': ol.interventions.zero([5])}")
    hooks = dict(hooks or {})
    resolve_sites(table, list(hooks), "hooks")  # an unknown name: one line, before anything runs
    chosen = resolve_sites(table, record, "sites", default=lambda s: s.layout == "tokens") if (
        record is not None or default_all) else []
    return _Plan(table, hooks, chosen)


def _texts(name: str, texts: Any) -> list[str]:
    out = arguments.texts(name, texts)
    if out is None:
        raise TypeError(f"{name}=None: pass the texts to run, a list of strings")
    return out


def _length(loaded, max_length: int | None) -> int:
    limit = int(loaded.max_length)
    if max_length is None:
        return limit
    max_length = arguments.count("max_length", max_length, 2)
    if max_length > limit:
        raise ValueError(f"max_length={max_length} exceeds what {loaded.name} accepts ({limit} tokens)")
    return max_length


def _plain_batches(tokenizer, texts: Sequence[str], max_length: int, batch_size: int) -> list[dict]:
    """Right-padded batches of consecutive texts, tokenized as the scoring batches are (truncated to
    ``max_length``)."""
    ids = tokenizer(list(texts), truncation=True, max_length=int(max_length))["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out = []
    for start in range(0, len(ids), batch_size):
        rows = ids[start:start + batch_size]
        t = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), t), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), t, dtype=torch.long)
        for b, r in enumerate(rows):
            input_ids[b, :len(r)], mask[b, :len(r)] = torch.tensor(r, dtype=torch.long), 1
        out.append({"input_ids": input_ids, "attention_mask": mask})
    return out


def _index(batches: Sequence[dict], labels: bool) -> TokenIndex:
    lengths, ids, labs = [], [], []
    for b in batches:
        keep = b["attention_mask"].bool()
        lengths += keep.sum(1).tolist()
        ids.append(b["input_ids"][keep])
        if labels:
            labs.append(b["labels"][keep])
    return TokenIndex(lengths, torch.cat(ids), torch.cat(labs) if labels else None)


def _forward(loaded, batch: dict, plan: _Plan, scored: bool):
    """One forward of ``batch``: the logits at its scored rows ``[n, V]`` (``scored``), else the body's (or, when
    the head's norm is asked for, the whole model's) forward, whose outputs the hooks have read."""
    from outlierlab.models.families import base_model
    from outlierlab.models.placement import eager_attention

    ids, mask = batch["input_ids"], batch["attention_mask"]
    if scored:
        sel = batch["labels"] != -100
        # ours narrows its head to the scored rows, so its head norm sees [n, d]: the whole head where it is asked
        out = loaded.forward(ids, mask, output_attentions=plan.attentions,
                             rows=None if plan.head and loaded.kind == "outlierlab" else sel)
        logits = out.logits
        return logits[sel.to(logits.device)] if logits.ndim == 3 else logits
    if plan.head and loaded.has_mlm_head:
        # a Hugging Face head projects no row onto the vocabulary (logits_at); ours runs on every row
        rows = None if loaded.kind == "outlierlab" else torch.zeros_like(mask, dtype=torch.bool)
        loaded.forward(ids, mask, output_attentions=plan.attentions, rows=rows)
        return None
    model, dev = loaded.model, loaded.device
    with torch.inference_mode():
        if loaded.kind == "outlierlab":
            getattr(model, "roberta", model)(ids.to(dev), mask.to(dev), output_attentions=plan.attentions)
        else:  # eager, as LoadedModel.forward runs a Hugging Face model: one attention path for every run here
            with eager_attention(model):
                base_model(model)(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                  output_attentions=plan.attentions)
    return None


def _execute(loaded, batches: Sequence[dict], plan: _Plan, writer: CacheWriter | None, scored: bool,
             keep_logits: bool = False, progress: bool = False):
    """Run ``batches`` with ``plan``'s hooks, recording its sites into ``writer``; the scored tokens' losses."""
    from outlierlab.models.hook_points import attached

    t_max = writer.tokens.max_length if writer is not None else 0
    seen: set[str] = set()

    def recorder(x, point):
        writer.write(point.name, point.texts, to_rows(x, point.attention_mask, point.layout, t_max))
        seen.add(point.name)

    merged: dict[str, list] = {}
    for name, fns in plan.hooks.items():
        merged[name] = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    for name in plan.record:  # after the hooks: the cache holds what flows on
        merged.setdefault(name, []).append(recorder)
    scores = {"total": 0.0, "correct": 0, "rows": [], "logits": []}
    bar = None
    if progress:
        from outlierlab.utils.progress import progress_bar

        bar = progress_bar(len(batches), f"[sites] {loaded.name}", unit="batches")
    start = 0
    try:
        with attached(loaded.model, merged, plan.table) as points:
            for i, batch in enumerate(batches):
                n = batch["input_ids"].shape[0]
                texts = torch.arange(start, start + n)
                for point in points.values():
                    point.batch, point.texts, point.attention_mask = i, texts, batch["attention_mask"]
                seen.clear()
                logits = _forward(loaded, batch, plan, scored)
                missing = [s for s in plan.record if s not in seen]
                if missing:
                    raise RuntimeError(f"{', '.join(missing)} not reached by {loaded.name}'s forward")
                if scored:
                    _score(batch, logits, start, scores, keep_logits)
                start += n
                if bar is not None:
                    bar.update(1)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
    return scores


def _score(batch: dict, logits, start: int, scores: dict, keep_logits: bool) -> None:
    """Per scored token: its loss and whether the top prediction is right; the sums in the order
    ``outlierlab.metrics.scored_rows.mlm_scores`` adds them, so the mean equals the ablation's to the bit."""
    sel = batch["labels"] != -100
    y = batch["labels"].to(logits.device)[sel.to(logits.device)]
    lg = logits.float()
    losses = F.cross_entropy(lg, y, reduction="none").double()
    hits = lg.argmax(-1) == y
    scores["total"] += float(losses.sum())
    scores["correct"] += int(hits.sum())
    where = sel.nonzero()
    scores["rows"].append((where[:, 0] + start, where[:, 1], y.cpu(), losses.cpu(), hits.cpu()))
    if keep_logits:
        scores["logits"].append(lg.cpu())


def _writer(tokens: TokenIndex, plan: _Plan, to, dtype: str, texts, meta: dict) -> CacheWriter | None:
    if not plan.record:
        return None
    if dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype={dtype!r}: the cache stores float32, float16 or bfloat16")
    path = None
    if to is not None:
        if isinstance(to, str) and to == "disk":
            path = Path(tempfile.mkdtemp(prefix="outlierlab-cache-"))
        elif isinstance(to, (str, os.PathLike)):
            path = Path(to)
            if path.exists() and (not path.is_dir() or any(path.iterdir())):
                raise FileExistsError(f"to={str(to)!r} exists and is not an empty directory: give a new one (a cache "
                                      "there is read with ol.load_cache)")
        else:
            raise TypeError(f"to={to!r}: pass None (memory), 'disk' (a new temporary directory) or a directory path")
    layouts = {n: plan.table[n].layout for n in plan.record}
    return CacheWriter(tokens, dtype, path, layouts, meta, texts)


def _meta(loaded, **run) -> dict:
    return {"model": loaded.name, "objective": loaded.objective, **run}


def run_with_cache(model: Any, texts: Sequence[str], sites: Sequence[str] | None = None, to: str | os.PathLike | None
                   = None, dtype: str = "float32", *, hooks: Mapping[str, Callable] | None = None, tokenizer: Any = None,
                   batch_size: int = 16, max_length: int | None = None, progress: bool = False) -> ActivationCache:
    """The activations of ``texts`` at ``sites``, with the tokens they belong to.

    Parameters
    ----------
    model : what ``outlierlab.api.load_encoder`` returns, or a model in memory with ``tokenizer=`` (ours:
        ``RobertaMaskedLM`` / ``RobertaEncoder``; a transformers model)
    texts : the texts, run as they are (no masks: ``run_with_hooks`` runs the scored, masked inputs), in batches
        of ``batch_size`` consecutive texts, each truncated to ``max_length`` tokens (None: the model's)
    sites : names (``sites``) or globs (``blocks.*.resid``); None: every site but the attention patterns (those
        are ``[H, T]`` per token: name them to have them)
    to : None: in memory; ``"disk"``: a new temporary directory; a path: that (new or empty) directory -- each site
        a ``.npy`` file written batch by batch, read back as a memory map (``outlierlab.models.activation_cache``),
        so a corpus far larger than memory is cached in one batch's memory
    dtype : the stored precision: ``float32``, ``float16`` or ``bfloat16``
    hooks : ``{site: fn}`` applied during the run (``run_with_hooks``); the cache holds what flows on after them

    Returns
    -------
    ActivationCache
        ``cache[site]``: ``[N, ...]``, one row per real token of every text (padding dropped), texts in order; a
        pattern per query token ``[H, T_max]``.  Beside them ``cache.input_ids``, ``cache.text_index``,
        ``cache.positions`` ``[N]``, ``cache.attention_mask`` ``[n_texts, T_max]``, ``cache.text(i, site)``,
        ``cache.mean(site)``, ``cache.frame()``.  A Hugging Face model runs with eager attention, as every run here.
    """
    loaded = _subject(model, tokenizer)
    texts = _texts("texts", texts)
    batch_size = arguments.count("batch_size", batch_size, 1)
    length = _length(loaded, max_length)
    plan = _plan(loaded, hooks, sites, default_all=True)
    if not plan.record:
        raise ValueError("sites=[]: name at least one site to cache (ol.sites(model) lists them)")
    batches = _plain_batches(loaded.tokenizer, texts, length, batch_size)
    tokens = _index(batches, labels=False)
    writer = _writer(tokens, plan, to, dtype, texts, _meta(loaded, max_length=length, batch_size=batch_size))
    _execute(loaded, batches, plan, writer, scored=False, progress=progress)
    return writer.finish()


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
    """The ablation's scoring batches (``outlierlab.datamodules.scoring_batches``): for a masked LM ``texts``
    masked as ``masked_batches`` masks them (or at the positions it masks ``masks_from``, each text of as many
    tokens); for a decoder the next-token batches."""
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
    plain = _plain_batches(tok, texts, length, batch_size)
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

    Scored as the ablation analysis scores (``evaluate.py analyses=[ablation]``, ``outlierlab.evaluation.analyses.ablation``):
    a masked LM on fixed, seeded masks -- ``mlm_probability`` of the non-special tokens replaced by the mask token
    (no 80/10/10), drawn per batch from ``seed`` and the texts' indices
    (``outlierlab.datamodules.scoring_batches.masked_batches``), so a run with hooks and one without, and the
    ablation on the same texts, score the same tokens; a decoder on every non-special next token.  (The ablation
    packs its sentences into sequences of ``max_length`` tokens first, ``ablation.pack``: pass
    ``outlierlab.datamodules.scoring_batches.pack_texts(tokenizer, texts, 128)`` to score what it scores.)

    Parameters
    ----------
    hooks : ``{site: fn}``; ``fn(activation, point)`` returns the new activation (or None: unchanged), ``point``
        the ``outlierlab.models.hook_points.HookPoint`` (``name``, ``layer``, ``batch``, ``texts``,
        ``attention_mask``); a list of functions: each in turn.  Ready ones: ``outlierlab.models.interventions``
        (``ol.interventions.zero / mean / clip / scale / quantize / patch``)
    cache, to, dtype : also cache these sites of this run (after the hooks), as ``run_with_cache`` does
    masks_from : texts whose masks to use (text ``i``'s masked positions on text ``i`` here, of as many tokens): the
        source run of activation patching, a corrupted text scored where the clean one is
    mlm_probability, batch_size, max_length : None: the ablation's (``configs/ablation``: 0.15, 16, 128 capped by the
        model); ``seed`` as the ablation's with ``ablation.seed=null`` (the global seed, 0)
    keep_logits : keep the scored rows' logits (``run.logits``)
    """
    from outlierlab.configuration.analysis_settings import AblationSettings

    loaded = _subject(model, tokenizer)
    if not loaded.has_mlm_head:
        raise ValueError(f"{loaded.name} has no LM head to score with: {loaded.no_head_reason} "
                         "(ol.run_with_cache reads its activations)")
    texts = _texts("texts", texts)
    masks_from = None if masks_from is None else _texts("masks_from", masks_from)
    defaults = AblationSettings()
    p = defaults.mlm_probability if mlm_probability is None else arguments.number("mlm_probability",
                                                                                  mlm_probability, 0.0, 1.0)
    batch_size = arguments.count("batch_size", defaults.batch_size if batch_size is None else batch_size, 1)
    length = min(defaults.max_length, loaded.max_length) if max_length is None else _length(loaded, max_length)
    seed = arguments.count("seed", seed, None)
    keep_logits = arguments.flag("keep_logits", keep_logits)
    plan = _plan(loaded, hooks, cache, default_all=False)
    batches = _scored_batches(loaded, texts, masks_from, length, batch_size, p, seed)
    writer = _writer(_index(batches, labels=True), plan, to, dtype, texts,
                     _meta(loaded, max_length=length, batch_size=batch_size, mlm_probability=p, seed=seed))
    scores = _execute(loaded, batches, plan, writer, scored=True, keep_logits=keep_logits)
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

    Text ``i`` of ``source`` is patched into text ``i`` of ``texts``, token by token (each pair of as many tokens),
    both scored on ``texts``' masks (a masked LM: ``source`` masked where ``texts`` is, ``masks_from``).  Patching a
    corrupted source into the clean texts asks what each site carries that the corruption destroys (noising);
    swap the two to ask what restores the clean loss (denoising).

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
    loaded = _subject(model, tokenizer)
    texts, source = _texts("texts", texts), _texts("source", source)
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
