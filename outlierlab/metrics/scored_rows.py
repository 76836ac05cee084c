"""A language model scored at chosen positions: its vocabulary projection run at those positions only
(``logits_at``), and the loss, perplexity and top-1 accuracy over them (``mlm_scores``) -- the masked positions a
masked LM is scored on, or a decoder's next tokens (Kovaleva et al. 2021's ablation, order use, the loop monitors'
held-out loss)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from outlierlab.metrics.position_shares import position_bucket, token_positions

__all__ = ["logits_at", "mlm_scores"]


@contextmanager
def logits_at(model: nn.Module, rows: torch.Tensor | None):
    """Inside the block, ``model``'s vocabulary projection runs at the positions ``rows`` (Bool ``[B, T]``) alone,
    giving ``logits`` ``[n, V]`` in row-major order; yields whether it could (False: the logits stay ``[B, T, V]``).

    A Hugging Face LM head projects every position (at 15 % masking that product is most of a small masked LM's forward,
    a fifth of BERT-base's).  A forward pre-hook on ``get_output_embeddings()`` hands it the selected rows, as fairseq's
    ``masked_tokens`` and our ``RobertaMaskedLM`` do; equal to the full projection's rows up to float rounding.  A model
    whose output embedding is not an ``nn.Linear`` (ours) is left as it is.
    """
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


@torch.inference_mode()
def mlm_scores(forward_logits: Callable[[Tensor, Tensor, Tensor], Tensor], batches: Iterable[Mapping[str, Tensor]],
               by_position: bool = False) -> dict:
    r"""Masked-LM loss, perplexity and top-1 accuracy over the masked positions of ``batches``.

    .. math:: \text{loss} = \frac{1}{N}\sum_{(b,t):\,y_{bt}\ne-100} -\log p(y_{bt}\mid x_b),\qquad
              \text{ppl} = e^{\text{loss}},\qquad \text{top1} = \frac1N\#\{\arg\max_v p(v\mid x_b)_t = y_{bt}\}

    ``forward_logits(input_ids, attention_mask, rows)`` returns the logits at the scored positions ``rows`` ``[n, V]``
    (``LoadedModel.forward(..., rows=rows)``) or everywhere ``[B, T, V]``.  ``by_position`` adds the same scores per
    position bucket (``position_bucket``; a row's position counts the real tokens before it, 0 = ``<s>``).

    Returns ``loss``, ``ppl``, ``top1``, ``n_masked`` and, with ``by_position``, ``{bucket: {"loss", "top1",
    "n_masked"}}`` in order, empty buckets left out.
    """
    total, correct, n = 0.0, 0, 0
    per = torch.zeros(0, 3, dtype=torch.float64)  # per bucket: loss sum, correct, count
    for b in batches:
        sel = b["labels"] != -100
        logits = forward_logits(b["input_ids"], b["attention_mask"], sel)
        sel = sel.to(logits.device)
        lg, y = (logits[sel] if logits.ndim == 3 else logits).float(), b["labels"].to(logits.device)[sel]
        losses, hits = F.cross_entropy(lg, y, reduction="none").double(), lg.argmax(-1) == y
        total += float(losses.sum())
        correct += int(hits.sum())
        n += int(sel.sum())
        if by_position and len(y):
            buckets = position_bucket(token_positions(b["attention_mask"], sel)).cpu()
            add = torch.stack([torch.bincount(buckets, weights=w, minlength=max(len(per), int(buckets.max()) + 1))
                               for w in (losses.cpu(), hits.cpu().double(), torch.ones(len(y), dtype=torch.float64))], 1)
            add[: len(per)] += per
            per = add
    if n == 0:
        raise ValueError("no masked token to score: the texts are too short or mlm_probability is 0")
    loss = total / n
    out = {"loss": loss, "ppl": math.exp(loss) if loss < 700 else math.inf, "top1": correct / n, "n_masked": n}
    if by_position:
        out["by_position"] = {k: {"loss": float(s / c), "top1": float(h / c), "n_masked": int(c)}
                              for k, (s, h, c) in enumerate(per.tolist()) if c}
    return out
