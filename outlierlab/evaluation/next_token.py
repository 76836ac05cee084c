"""Next-token scoring on held-out text: the decoder counterpart of :mod:`outlierlab.evaluation.masked_lm`.

Kovaleva et al. (2021) score the masked-LM loss of BERT with LayerNorm outlier dims disabled; a decoder
(GPT-2, Pythia, Llama-style; the families Luo et al. 2021 ask about and Sun et al. 2024 study) is scored the
way it was trained, by the cross-entropy of every next token given its left context.  :func:`next_token_batches`
builds batches whose ``labels`` line up with the logits (``labels[t]`` = the token at ``t + 1``), so the one
scorer :func:`outlierlab.evaluation.masked_lm.mlm_scores` serves both objectives; :func:`predict_next` is the
counterpart of :func:`~outlierlab.evaluation.masked_lm.fill_mask` for the report's example sentence.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["next_token_batches", "predict_next"]


def next_token_batches(tokenizer, texts: Sequence[str], max_length: int = 128,
                       batch_size: int = 16) -> list[dict[str, Tensor]]:
    r"""Right-padded batches ``{"input_ids", "attention_mask", "labels"}`` for next-token scoring.

    .. math:: \text{labels}_{b,t} = x_{b,t+1}\ \text{if } t+1 \text{ is a real, non-special token, else } -100

    so ``logits[b, t]`` (the model's prediction from tokens ``0..t``) is scored against the next token.
    Special tokens (a tokenizer's ``<s>``/``[SEP]``) are never targets — as masked-LM evaluation masks only
    non-special tokens — and padding (the eos id when the tokenizer has no pad token) is masked out.
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


@torch.inference_mode()
def predict_next(loaded, text: str, top_k: int = 5) -> list[tuple[str, float]]:
    """Top-``k`` next tokens (token, probability) after the part of ``text`` before ``{mask}`` (the whole
    text when it has none), trailing special tokens (e.g. ``[SEP]``) removed from the prompt."""
    tok = loaded.tokenizer
    prefix = text.split("{mask}")[0].split(tok.mask_token)[0] if tok.mask_token else text.split("{mask}")[0]
    ids = tok(prefix.rstrip(), truncation=True, max_length=loaded.max_length)["input_ids"]
    special = set(tok.all_special_ids)
    while len(ids) > 1 and ids[-1] in special:
        ids = ids[:-1]
    if not ids:
        raise ValueError(f"example sentence {text!r} gives an empty prompt")
    x = torch.tensor([ids])
    logits = loaded.forward(x, torch.ones_like(x)).logits[0, -1]
    probs, top = logits.float().softmax(-1).topk(top_k)
    return [(tok.decode([int(i)]).strip(), float(p)) for p, i in zip(probs, top)]
