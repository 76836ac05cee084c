"""Attention mass on special tokens ("attention sinks"; Kovaleva et al. 2019/2021; Puccetti et al. 2022).

Heads that park most of their attention on ``<s>``/``[CLS]`` or ``</s>``/``[SEP]`` are one of the
mechanisms tied to outlier dimensions.  For each head we measure the attention probability that
valid queries put on the given keys, averaged over those queries.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["special_token_attention_mass", "special_key_masks", "AttentionMassAccumulator"]


def _mass_sums(attn: Tensor, key_mask: Tensor, query_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Sum over valid queries of the attention mass on ``key_mask`` keys → (Tensor[..., H], n_queries)."""
    if attn.ndim < 4:
        raise ValueError(f"attention must be [..., B, H, Tq, Tk], got {tuple(attn.shape)}.")
    b, _, tq, tk = attn.shape[-4:]
    if tuple(key_mask.shape) != (b, tk):
        raise ValueError(f"key mask must be [B={b}, Tk={tk}], got {tuple(key_mask.shape)}.")
    a = attn.detach().to(torch.float64)
    per_query = torch.einsum("...bhqk,bk->...bhq", a, key_mask.to(a.device, torch.float64))
    qm = torch.ones(b, tq, dtype=torch.float64, device=a.device) if query_mask is None \
        else query_mask.to(a.device, torch.float64)
    if tuple(qm.shape) != (b, tq):
        raise ValueError(f"query mask must be [B={b}, Tq={tq}], got {tuple(qm.shape)}.")
    return torch.einsum("...bhq,bq->...h", per_query, qm), qm.sum()


def special_token_attention_mass(attn: Tensor, key_is_special: Tensor | Mapping[str, Tensor],
                                 query_mask: Tensor | None = None) -> Tensor | dict[str, Tensor]:
    r"""Average attention mass that valid queries put on the given keys, per head.

    .. math:: m_h = \frac{1}{|Q|}\sum_{(b,q)\in Q}\ \sum_{k:\ \text{special}(b,k)} A_{b,h,q,k}

    Parameters
    ----------
    attn : Tensor[B, H, Tq, Tk] or Tensor[L, B, H, Tq, Tk]
        Attention probabilities (rows sum to 1), e.g. ``torch.stack(outputs.attentions)``.
    key_is_special : Bool[B, Tk], or a mapping name -> Bool[B, Tk]
        Keys whose mass is counted; a mapping (e.g. from :func:`special_key_masks`) gives one result
        per entry, e.g. separately for ``<s>`` and ``</s>``.
    query_mask : Bool[B, Tq] or None
        Queries to average over (typically non-pad tokens); None: all queries.

    Returns
    -------
    Tensor[H] (Tensor[L, H] with a layer axis), float64 — or a dict of those for a mapping.
    """
    if isinstance(key_is_special, Mapping):
        return {k: special_token_attention_mass(attn, m, query_mask) for k, m in key_is_special.items()}
    s, n = _mass_sums(attn, key_is_special, query_mask)
    if n == 0:
        raise ValueError("no valid query: query_mask is all False.")
    return s / n


def special_key_masks(input_ids: Tensor, bos_token_id: int, eos_token_id: int,
                      attention_mask: Tensor | None = None) -> dict[str, Tensor]:
    """``{"bos": ids == bos, "eos": ids == eos, "special": either}`` as Bool[B, T] (padding excluded)."""
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    bos, eos = (input_ids == bos_token_id) & valid, (input_ids == eos_token_id) & valid
    return {"bos": bos, "eos": eos, "special": bos | eos}


class AttentionMassAccumulator:
    """Streaming :func:`special_token_attention_mass` over batches (float64 sums; memory O(L·H)).

    Parameters
    ----------
    shape : tuple
        Shape of one result, ``(H,)`` or ``(L, H)``.
    """

    def __init__(self, shape: tuple[int, ...]):
        self.sum = torch.zeros(shape, dtype=torch.float64)
        self.n_queries = torch.zeros((), dtype=torch.float64)

    def update(self, attn: Tensor, key_is_special: Tensor, query_mask: Tensor | None = None) -> None:
        s, n = _mass_sums(attn, key_is_special, query_mask)
        if s.shape != self.sum.shape:
            raise ValueError(f"accumulator shape {tuple(self.sum.shape)} does not match result {tuple(s.shape)}.")
        self.sum += s.cpu()
        self.n_queries += n.cpu()

    def compute(self) -> Tensor:
        if self.n_queries == 0:
            raise ValueError("AttentionMassAccumulator is empty.")
        return self.sum / self.n_queries
