"""``order_use`` for evaluate.py: does a model (ours or any Hugging Face model with its LM head) use word order?

The loss on held-out text with each piece's tokens permuted minus the intact loss (``word_order.order_use``), every
layer's attention locality (``word_order.attention_locality``) and, for every model (the only measure without an LM
head), how far shuffling moves each layer's mean-pooled vector (``word_order.pooled_order_change``); docs/order_use.md.
Masked LMs score the ablation's fixed, seeded 15 % (``scoring_batches.masked_batches``), causal LMs every next token.
Below the threshold a model gets train.py's line ("cannot" for our masked LM without positions).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from outlierlab.metrics.word_order import (attention_locality, cannot_use_order, heldout_special_ids, order_use,
                                           order_use_message, pooled_order_change)
from outlierlab.evaluation.analyses.attention_sinks import text_batches
from outlierlab.datamodules.scoring_batches import masked_batches, pack_texts
from outlierlab.evaluation.registry import AnalysisResult, EvalContext, analysis_texts, check_texts, shared_mlm
from outlierlab.configuration.analysis_settings import OrderUseSettings

#: Scores with the model's LM head: evaluate.py loads the encoder with it, once.
LM_HEAD = True

#: ``order_use.csv``, one row for the model: order use in nats and the losses it is the difference of (empty without
#: an LM head), the predicted tokens, the attention locality of uniform rows, the texts the vectors were shuffled in.
COLUMNS = ["order_use", "loss", "loss_permuted", "tokens", "attn_local_uniform", "pooled_order_change_texts"]
#: ``order_use_layers.csv``, one row per layer (0 = the embedding output, as every table numbers layers): attention
#: mass within 2 tokens of the query (none at layer 0) and 1 - cosine of each text's mean-pooled vector, intact against
#: its tokens shuffled.
LAYER_COLUMNS = ["layer", "attn_local", "pooled_order_change"]

TITLE = "## Order use: does the model use word order? (docs/order_use.md)"


def check(ctx: EvalContext) -> None:
    """Settings and files, before any encoding (called by evaluate.py)."""
    check_texts(ctx.settings(OrderUseSettings))


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


def run(ctx: EvalContext) -> AnalysisResult:
    """Order use and attention locality of the evaluated model (``configs/order_use/default.yaml``), and the
    sentence-vector order change of every layer -- the one order measure a model without an LM head has."""
    s = ctx.settings(OrderUseSettings)
    texts, what = analysis_texts(ctx, s)
    return measure(shared_mlm(ctx), texts, what, s, ctx.seed if s.seed is None else s.seed)


@torch.inference_mode()
def measure(loaded, texts: list[str], what: str, s: OrderUseSettings = OrderUseSettings(),
            seed: int = 0) -> AnalysisResult:
    """``run`` on a loaded model (``outlierlab.models.lm_model.load_mlm``) and texts (``what`` says which,
    for the report): also what probe.py reports beside its position probe."""
    tok = loaded.tokenizer
    special = heldout_special_ids(None, tok)  # the tokenizer's <s> </s> <pad> / [CLS] [SEP] [PAD]
    sentences = text_batches(tok, texts, min(s.max_length, loaded.max_length), s.batch_size)
    if loaded.has_mlm_head:
        batches = _batches(loaded, texts, s, seed)
        rows, lines, summary = _loss_section(loaded, batches, special, what, s, seed)
        first = batches[0]
    else:  # a sentence encoder (MiniLM) or a bare encoder body: its vectors are what it is used for
        first = {"input_ids": sentences[0][0], "attention_mask": sentences[0][1]}
        lines = [TITLE, "", f"{loaded.name} has no LM head ({loaded.no_head_reason}): order use in nats needs the "
                 "model's own loss; what shuffling does to its vectors is below."]
        rows, summary = {}, {"order_use": None, "no_lm_head": loaded.no_head_reason}
    local, local_line = _locality(loaded, first)
    change, change_line = _pooled_change(loaded, sentences, special, seed)
    summary["pooled_order_change"] = change["change"].tolist()
    model_row = {c: None for c in COLUMNS} | rows | {"attn_local_uniform": local.get("uniform"),
                                                      "pooled_order_change_texts": change["texts"]}
    mass, moved = local.get("mass", []), change["change"].tolist()
    layers = [{"layer": i, "attn_local": float(mass[i - 1]) if 0 < i <= len(mass) else None,
               "pooled_order_change": moved[i] if i < len(moved) else None}
              for i in range(max(len(moved), len(mass) + 1 if len(mass) else 0))]
    return AnalysisResult("order_use", [model_row], "\n".join(lines + local_line + change_line) + "\n", summary=summary,
                          tables={"order_use_layers": (layers, LAYER_COLUMNS)})


def _loss_section(loaded, batches, special, what: str, s: OrderUseSettings, seed: int):
    """Order use in nats (``outlierlab.metrics.word_order.order_use``) on the model's own loss."""
    res = order_use(_loss_sum(loaded), batches, special, seed=seed)
    rows = {name: res[name] for name in ("order_use", "loss", "loss_permuted", "tokens")}
    lines = [TITLE, "", f"{loaded.name}, {loaded.objective.replace('_', ' ')} loss on {what}, "
             f"{int(res['tokens'])} predicted tokens: intact {res['loss']:.4f} nats, tokens permuted within each "
             f"piece {res['loss_permuted']:.4f} nats, **order use {res['order_use']:.4f} nats**."]
    line = order_use_message(res["order_use"], s.threshold, orderless(loaded))
    if line is not None:
        lines += ["", line[0].upper() + line[1:] + "."]
    return rows, lines, {"order_use": res["order_use"], "loss": res["loss"], "below_threshold": line is not None}


def _locality(loaded, first: dict) -> tuple[dict, list[str]]:
    """Attention locality of every layer on the first batch: ``{"mass": [per layer], "uniform": float}`` (empty where
    the model returns no attentions)."""
    attentions = loaded.forward(first["input_ids"], first["attention_mask"], output_attentions=True).attentions
    if not attentions or attentions[0] is None:
        return {}, []
    local = attention_locality([a.float() for a in attentions], first["attention_mask"].to(attentions[0].device),
                               causal=loaded.is_decoder)
    local = {"mass": [float(m) for m in local["mass"]], "uniform": float(local["uniform"])}
    return local, ["", f"Attention mass within 2 tokens of the query (first batch; uniform rows: "
                  f"{float(local['uniform']):.3f}): " + ", ".join(f"layer {i + 1} {float(m):.3f}"
                                                                  for i, m in enumerate(local["mass"])) + "."]


def _pooled_change(loaded, sentences, special, seed: int) -> tuple[dict, list[str]]:
    """``outlierlab.metrics.word_order.pooled_order_change`` of every layer on the texts as sentences."""
    def hidden_states(ids, mask):  # no LM head projection: the vectors are all this needs
        rows = torch.zeros_like(ids, dtype=torch.bool) if loaded.has_mlm_head else None
        return loaded.forward(ids, mask, output_hidden_states=True, rows=rows).hidden_states

    try:
        change = pooled_order_change(hidden_states, sentences, special, seed=seed)
    except ValueError as e:  # one-token texts: nothing to shuffle; the rest of the section stands
        return {"change": torch.zeros(0), "texts": 0}, ["", f"Sentence vectors not compared: {e}."]
    values = change["change"].tolist()
    line = ["", f"Sentence vectors, each text's tokens shuffled ({change['texts']} texts; 1 - cosine of the "
            "mean-pooled vectors, intact against shuffled; 0 = the same vector in any order, layer 0 = the floor the embedding "
            "LayerNorm leaves): " + ", ".join(f"layer {i} {v:.4f}" for i, v in enumerate(values)) + "."]
    return change, line
