"""Held-out text as scoring batches for a language model's own head: masked positions for a masked LM, next
tokens for a causal one -- what Kovaleva et al.'s (2021) ablation, the order-use measure and the frequent-token
analysis score (with ``outlierlab.metrics.scored_rows.lm_scores``).

``pack_texts`` joins sentences into pretraining-like blocks, ``masked_batches`` masks them deterministically
(the same masks under every condition), ``next_token_batches`` lines labels up with a decoder's logits
(``labels[t]`` = the token at ``t + 1``), so one scorer serves both objectives.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from outlierlab.datamodules.masking import DeterministicMLMCollator

__all__ = ["pack_texts", "masked_batches", "next_token_batches"]


def pack_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[str]:
    """Join consecutive texts (with a space) into pieces of at most ``max_length`` tokens incl. specials, the
    running-text context MLM pretraining sees.  A text longer than the budget stays alone (truncated when tokenized)."""
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

    Each non-special token is selected with probability ``mlm_probability`` and becomes ``<mask>`` (no 80/10/10 at
    evaluation); ``DeterministicMLMCollator`` seeded from ``seed`` and the text indices, so the same call gives the same
    masks.
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


def next_token_batches(tokenizer, texts: Sequence[str], max_length: int = 128,
                       batch_size: int = 16) -> list[dict[str, Tensor]]:
    r"""Right-padded batches ``{"input_ids", "attention_mask", "labels"}`` for next-token scoring.

    .. math:: \text{labels}_{b,t} = x_{b,t+1}\ \text{if } t+1 \text{ is a real, non-special token, else } -100

    Special tokens are never targets (as masked-LM evaluation masks only non-special tokens); padding is masked out.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token: cannot batch texts for next-token scoring")
    enc = tokenizer(list(texts), truncation=True, max_length=int(max_length), return_special_tokens_mask=True)
    batches = []
    for start in range(0, len(texts), batch_size):
        ids, special = enc["input_ids"][start:start + batch_size], enc["special_tokens_mask"][start:start + batch_size]
        t = max(len(r) for r in ids)
        input_ids = torch.full((len(ids), t), pad, dtype=torch.long)
        mask = torch.zeros(len(ids), t, dtype=torch.long)
        labels = torch.full((len(ids), t), -100, dtype=torch.long)
        for b, (row, sp) in enumerate(zip(ids, special)):
            n = len(row)
            input_ids[b, :n], mask[b, :n] = torch.tensor(row), 1
            target = torch.tensor(row[1:])
            keep = ~torch.tensor(sp[1:], dtype=torch.bool)
            labels[b, :n - 1] = torch.where(keep, target, torch.full_like(target, -100))
        batches.append({"input_ids": input_ids, "attention_mask": mask, "labels": labels})
    return batches
