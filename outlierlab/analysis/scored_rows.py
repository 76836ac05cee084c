"""A language model's vocabulary projection at chosen positions only: the masked positions a masked LM is scored
on (Kovaleva et al. 2021's ablation, order use, the loop monitors' held-out loss)."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["logits_at"]


@contextmanager
def logits_at(model: nn.Module, rows: torch.Tensor | None):
    """Inside the block, ``model``'s vocabulary projection runs at the positions ``rows`` (Bool ``[B, T]``) alone, and
    its ``logits`` are ``[n, V]`` in row-major order of those positions; yields whether it could (False: the
    logits stay ``[B, T, V]`` and the caller indexes them).

    A Hugging Face LM head projects every position onto the vocabulary: at 15 % masking that ``[B·T, V]``
    product is most of a small masked LM's forward and a fifth of BERT-base's (768 × 30,522 against its body's
    ≈ 85M multiply-adds per token).  A forward pre-hook on the output embedding (``get_output_embeddings()``, the
    head's last Linear) hands it the selected rows, as fairseq's ``masked_tokens`` and our own
    :class:`~outlierlab.models.RobertaMaskedLM` (its ``masked_positions``) do; the logits equal the full projection's rows up to float
    rounding (tests/test_order_use.py, tests/test_scored_rows.py).  Hand-written: transformers' masked-LM classes take
    no such argument.  A model whose output embedding is not an ``nn.Linear`` (ours) is left as it is."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if rows is not None and callable(get) else None
    if not isinstance(head, nn.Linear):
        yield False
        return

    def select(module, args):
        x, keep = args[0], rows.to(args[0].device)
        return (x[keep] if x.shape[:-1] == keep.shape else x[keep.reshape(-1)], *args[1:])  # [B, T, d] or [B·T, d]

    hook = head.register_forward_pre_hook(select)
    try:
        yield True
    finally:
        hook.remove()
