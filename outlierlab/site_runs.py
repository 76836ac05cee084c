"""Named sites from Python: every activation of any supported model by one name, listed and cached to memory or
disk (the scored runs with hooks and activation patching: ``outlierlab.scored_runs``).

    import outlierlab as ol
    enc = ol.load_encoder("outputs/train/RUN")                 # or any model ol.load_encoder takes
    ol.sites(enc)                                              # ['embed', 'ln_embed', 'blocks.1.attn.q', ...]
    cache = ol.run_with_cache(enc, texts, sites=["blocks.*.resid"], to="disk")
    cache["blocks.3.resid"]                                    # [N tokens, d]; cache.text_index, cache.positions

The names, the tensor each one is and its shape: ``outlierlab.models.hook_points`` (docs/sites.md).  Like
TransformerLens (Nanda & Bloom 2022) -- ``run_with_cache``, ``run_with_hooks``, hooks ``fn(activation, hook)`` -- but
for the models of this project (RoBERTa, BERT, DeBERTa, ModernBERT, our own encoders; decoders too), with caches
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

from outlierlab.models.activation_cache import ActivationCache, CacheWriter, TokenIndex, to_rows
from outlierlab.monitoring import arguments

__all__ = ["sites", "run_with_cache"]


# ---------------------------------------------------------------------------------------------- the model
def as_loaded(model: Any, tokenizer: Any = None):
    """``model`` (a loaded encoder or a model in memory with ``tokenizer=``) as a ``LoadedModel``, head included."""
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
    """Our encoder in memory, put in eval mode."""
    from outlierlab.models.encoder import RobertaMaskedLM
    from outlierlab.models.hook_points import model_family
    from outlierlab.models.lm_model import LoadedModel, layernorm_map

    model.eval()
    head = isinstance(model, RobertaMaskedLM)
    causal = bool(getattr(model.config, "causal", False))
    return LoadedModel(model, tokenizer, layernorm_map(model) if head else {}, "outlierlab",
                       f"{type(model).__name__} in memory", head,
                       "" if head else "a RobertaEncoder is the body without its LM head: pass the RobertaMaskedLM",
                       max_length=int(model.config.max_len), objective="next_token" if causal else "masked_lm",
                       family=model_family(model))


def sites(model: Any, tokenizer: Any = None, hidden_states: bool = False) -> list[str]:
    """The names of every site of ``model``, in depth order: ``embed``, ``ln_embed``, per block
    ``blocks.{i}.attn.q|k|v|pattern|out``, ``blocks.{i}.ln_attn``, ``blocks.{i}.ffn.pre|post|out``,
    ``blocks.{i}.ln_ffn``, ``blocks.{i}.resid`` (blocks numbered from 1, as hidden states: ``blocks.{i}.resid`` is
    hidden state ``i``), ``ln_final``, ``ln_head``; a site the model lacks is absent.  Which tensor each one is, and
    its shape: ``outlierlab.models.hook_points``.

    ``model``: what ``outlierlab.api.load_encoder`` returns, or a model in memory with its ``tokenizer=``.
    ``hidden_states=True``: the ``L + 1`` sites that are ``output_hidden_states`` (the layers of evaluate.py's tables
    and the monitors' ``layer_<i>``): ``embed``, ``blocks.{i}.resid``, and ``ln_final`` last where there is one."""
    from outlierlab.models.hook_points import hidden_state_sites, site_names

    model = as_loaded(model, tokenizer).model
    return hidden_state_sites(model) if arguments.flag("hidden_states", hidden_states) else site_names(model)


# --------------------------------------------------------------------------------------------- the runs
@dataclass
class RunPlan:
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


def plan_run(loaded, hooks: Mapping | None, record: Sequence[str] | None, default_all: bool) -> RunPlan:
    from outlierlab.models.hook_points import resolve_sites, site_table

    table = site_table(loaded.model)
    if hooks is not None and not isinstance(hooks, Mapping):
        raise TypeError(f"hooks is a {type(hooks).__name__}: pass {{site: fn}}, e.g. "
                        "{'blocks.1.resid': ol.interventions.zero([5])}")
    hooks = dict(hooks or {})
    resolve_sites(table, list(hooks), "hooks")  # an unknown name: one line, before anything runs
    chosen = resolve_sites(table, record, "sites", default=lambda s: s.layout == "tokens") if (
        record is not None or default_all) else []
    return RunPlan(table, hooks, chosen)


def text_list(name: str, texts: Any) -> list[str]:
    out = arguments.texts(name, texts)
    if out is None:
        raise TypeError(f"{name}=None: pass the texts to run, a list of strings")
    return out


def run_length(loaded, max_length: int | None) -> int:
    limit = int(loaded.max_length)
    if max_length is None:
        return limit
    max_length = arguments.count("max_length", max_length, 2)
    if max_length > limit:
        raise ValueError(f"max_length={max_length} exceeds what {loaded.name} accepts ({limit} tokens)")
    return max_length


def plain_batches(tokenizer, texts: Sequence[str], max_length: int, batch_size: int) -> list[dict]:
    """Right-padded batches of consecutive texts, truncated to ``max_length`` as the scoring batches are."""
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


def token_index(batches: Sequence[dict], labels: bool) -> TokenIndex:
    lengths, ids, labs = [], [], []
    for b in batches:
        keep = b["attention_mask"].bool()
        lengths += keep.sum(1).tolist()
        ids.append(b["input_ids"][keep])
        if labels:
            labs.append(b["labels"][keep])
    return TokenIndex(lengths, torch.cat(ids), torch.cat(labs) if labels else None)


def _forward(loaded, batch: dict, plan: RunPlan, scored: bool):
    """One forward of ``batch``: the logits at its scored rows ``[n, V]`` (``scored``), else None (the hooks read)."""
    from outlierlab.models.family_spec import base_model
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


def execute_run(loaded, batches: Sequence[dict], plan: RunPlan, writer: CacheWriter | None, scored: bool,
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
    """Per scored token its loss and top-1 hit, summed in ``mlm_scores``' order (the ablation's mean to the bit)."""
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


def cache_writer(tokens: TokenIndex, plan: RunPlan, to, dtype: str, texts, meta: dict) -> CacheWriter | None:
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


def run_meta(loaded, **run) -> dict:
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
    loaded = as_loaded(model, tokenizer)
    texts = text_list("texts", texts)
    batch_size = arguments.count("batch_size", batch_size, 1)
    length = run_length(loaded, max_length)
    plan = plan_run(loaded, hooks, sites, default_all=True)
    if not plan.record:
        raise ValueError("sites=[]: name at least one site to cache (ol.sites(model) lists them)")
    batches = plain_batches(loaded.tokenizer, texts, length, batch_size)
    tokens = token_index(batches, labels=False)
    writer = cache_writer(tokens, plan, to, dtype, texts, run_meta(loaded, max_length=length, batch_size=batch_size))
    execute_run(loaded, batches, plan, writer, scored=False, progress=progress)
    return writer.finish()
