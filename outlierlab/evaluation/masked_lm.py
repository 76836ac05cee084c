"""Masked-LM scoring on held-out text: the measurement of Kovaleva et al.'s (2021) ablation.

Plain functions, usable without ``evaluate.py``: :func:`pack_texts` joins sentences into pretraining-like
blocks, :func:`masked_batches` masks them deterministically (the same masks under every condition),
:func:`mlm_scores` gives loss / perplexity / top-1 over the masked positions, :func:`fill_mask` the top
predictions for one sentence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from outlierlab.datamodules.masking import DeterministicMLMCollator
from outlierlab.models.lm_model import LoadedModel

__all__ = ["pack_texts", "masked_batches", "mlm_scores", "fill_mask"]


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
    elsewhere.  The masking is :class:`outlierlab.datamodules.masking.DeterministicMLMCollator` (transformers'
    collator seeded per batch from ``seed`` and the text indices), so the same call gives the same masks.
    """
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
def mlm_scores(forward_logits: Callable[[Tensor, Tensor, Tensor], Tensor], batches: Iterable[Mapping[str, Tensor]]) -> dict:
    r"""Masked-LM loss, perplexity and top-1 accuracy over the masked positions of ``batches``.

    .. math:: \text{loss} = \frac{1}{N}\sum_{(b,t):\,y_{bt}\ne-100} -\log p(y_{bt}\mid x_b),\qquad
              \text{ppl} = e^{\text{loss}},\qquad \text{top1} = \frac1N\#\{\arg\max_v p(v\mid x_b)_t = y_{bt}\}

    Parameters
    ----------
    forward_logits : callable ``(input_ids, attention_mask, rows) -> logits``: ``rows`` (Bool ``[B, T]``) are the
        scored positions; the logits at them ``[n, V]`` (``LoadedModel.forward(..., rows=rows)``: a Hugging Face
        head then projects those rows alone), or at every position ``[B, T, V]``
    batches : iterable of ``{"input_ids", "attention_mask", "labels"}``

    Returns
    -------
    dict with ``loss``, ``ppl``, ``top1``, ``n_masked``.
    """
    total, correct, n = 0.0, 0, 0
    for b in batches:
        sel = b["labels"] != -100
        logits = forward_logits(b["input_ids"], b["attention_mask"], sel)
        sel = sel.to(logits.device)
        lg, y = (logits[sel] if logits.ndim == 3 else logits).float(), b["labels"].to(logits.device)[sel]
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
