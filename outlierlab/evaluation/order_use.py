"""``order_use`` for evaluate.py: does a model -- a run of ours or any Hugging Face encoder or decoder with its LM
head -- use word order? The model's own loss on held-out text with each piece's tokens permuted minus the intact
loss (:func:`outlierlab.analysis.order_use.order_use`), and the attention locality of every layer
(:func:`outlierlab.analysis.order_use.attention_locality`); docs/order_use.md.

Masked LMs score a fixed, seeded 15 % of the tokens behind the mask token (the masking of the ablation,
:func:`outlierlab.datamodules.scoring_batches.masked_batches`, on the same packed running-text pieces); causal LMs every
next token. A model below the threshold gets the one line train.py prints ("cannot" for a masked LM of ours
without positions).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from outlierlab.analysis.order_use import (attention_locality, cannot_use_order, heldout_special_ids, order_use,
                                           order_use_message)
from outlierlab.evaluation.attention_sinks import text_batches
from outlierlab.evaluation.common import skip_result
from outlierlab.datamodules.scoring_batches import masked_batches, pack_texts
from outlierlab.evaluation.common import analysis_texts, check_texts, shared_mlm
from outlierlab.evaluation.registry import AnalysisResult, EvalContext
from outlierlab.evaluation.settings import OrderUseSettings, load_settings

#: Scores with the model's LM head: evaluate.py loads the encoder with it, once.
LM_HEAD = True

COLUMNS = ["layer", "statistic", "value"]  # evaluate.py writes this header even when the model has no LM head

TITLE = "## Order use: does the model use word order? (docs/order_use.md)"


def check(ctx: EvalContext) -> None:
    """Settings and files, before any encoding (called by evaluate.py)."""
    check_texts(load_settings(OrderUseSettings, ctx.cfg))


def _batches(loaded, texts, s: OrderUseSettings, seed: int) -> list[dict]:
    tok, max_length = loaded.tokenizer, min(s.max_length, loaded.max_length)
    if loaded.is_decoder:  # next token: every real token is a label (padding is not)
        return [{"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
                for ids, mask in text_batches(tok, texts, max_length, s.batch_size)]
    return masked_batches(tok, pack_texts(tok, texts, max_length), max_length, s.batch_size, s.mlm_probability, seed)


def orderless(loaded) -> bool:
    """A masked LM of ours without positions (permutation-equivariant: order use 0 by construction), known from its
    config -- ours (``pos``) or its Hugging Face export's (``outlierlab_pos`` in config.json)."""
    cfg = getattr(loaded.model, "config", None)
    pos = getattr(cfg, "outlierlab_pos", None)
    if pos is None and isinstance(getattr(cfg, "pos", None), dict):
        pos = cfg.pos.get("name")
    return cannot_use_order(pos, loaded.is_decoder)


def _loss_sum(loaded):
    """``batch -> (summed loss, count)`` through the loaded model's logits (ours, HF, device_map-sharded alike)."""
    def loss_sum(batch):
        labels = batch["labels"]
        if loaded.is_decoder:  # position t predicts token t + 1
            rows = torch.zeros_like(labels, dtype=torch.bool)
            rows[:, :-1] = labels[:, 1:] != -100
            targets = labels[:, 1:][labels[:, 1:] != -100]
        else:  # a masked LM's head projects the masked rows alone (LoadedModel.forward)
            rows = labels != -100
            targets = labels[rows]
        logits = loaded.forward(batch["input_ids"], batch["attention_mask"], rows=rows).logits
        return F.cross_entropy(logits.float(), targets.to(logits.device), reduction="sum").double(), targets.numel()
    return loss_sum


@torch.inference_mode()
def run(ctx: EvalContext) -> AnalysisResult:
    """Order use and attention locality of the evaluated model (``configs/order_use/default.yaml``)."""
    s = load_settings(OrderUseSettings, ctx.cfg)
    loaded = shared_mlm(ctx)
    if not loaded.has_mlm_head:
        return skip_result("order_use", TITLE, f"{loaded.name} has no LM head ({loaded.no_head_reason}); order use "
                                               "is measured on the model's own loss.")
    seed = ctx.seed if s.seed is None else s.seed
    texts, what = analysis_texts(ctx, s)
    batches = _batches(loaded, texts, s, seed)
    tok = loaded.tokenizer
    special = heldout_special_ids(None, tok)  # the tokenizer's <s> </s> <pad> / [CLS] [SEP] [PAD]
    res = order_use(_loss_sum(loaded), batches, special, seed=seed)
    rows = [{"layer": "model", "statistic": name, "value": res[name]}
            for name in ("order_use", "loss", "loss_permuted", "tokens")]
    lines = [TITLE, "", f"{loaded.name}, {loaded.objective.replace('_', ' ')} loss on {what}, "
             f"{int(res['tokens'])} predicted tokens: intact {res['loss']:.4f} nats, tokens permuted within each "
             f"piece {res['loss_permuted']:.4f} nats, **order use {res['order_use']:.4f} nats**."]
    line = order_use_message(res["order_use"], s.threshold, orderless(loaded))
    if line is not None:
        lines += ["", line[0].upper() + line[1:] + "."]
    first = batches[0]
    attentions = loaded.forward(first["input_ids"], first["attention_mask"], output_attentions=True).attentions
    if attentions and attentions[0] is not None:
        local = attention_locality([a.float() for a in attentions], first["attention_mask"].to(attentions[0].device),
                                   causal=loaded.is_decoder)
        rows += [{"layer": f"layer_{i + 1}", "statistic": "attn_local", "value": float(m)}
                 for i, m in enumerate(local["mass"])]
        rows.append({"layer": "model", "statistic": "attn_local_uniform", "value": float(local["uniform"])})
        lines += ["", f"Attention mass within 2 tokens of the query (first batch; uniform rows: "
                  f"{float(local['uniform']):.3f}): " + ", ".join(f"layer {i + 1} {float(m):.3f}"
                                                                    for i, m in enumerate(local["mass"])) + "."]
    summary = {"order_use": res["order_use"], "loss": res["loss"], "below_threshold": line is not None}
    return AnalysisResult("order_use", rows, "\n".join(lines) + "\n", summary=summary)
