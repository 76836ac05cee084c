"""Attention mass on special tokens ("attention sinks"), sink-head shares and attention entropy.

Heads that park most of their attention on ``<s>``/``[CLS]`` or ``</s>``/``[SEP]`` are one of the
mechanisms tied to outlier dimensions (Kovaleva et al. 2019/2021; Puccetti et al. 2022).  For each head we
measure the attention probability that valid queries put on the given keys, averaged over those queries
(``special_token_attention_mass``); Gu et al. (2025, "When Attention Sink Emerges in Language Models:
An Empirical View", ICLR 2025) turn it into a per-layer share of *sink heads* (``sink_head_share``,
mass on the first token above ε = 0.3) and also track how peaked attention is (``attention_entropy``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["special_token_attention_mass", "special_key_masks", "AttentionMassAccumulator", "sink_head_share",
           "attention_entropy", "AttentionEntropyAccumulator", "SINK_THRESHOLD", "attention_row_mass",
           "first_token_mask", "later_key_mass", "sink_masses", "SINK_KEYS"]

#: Gu et al. (2025)'s ε: a head is a sink head when its mean attention on the token exceeds this.
SINK_THRESHOLD = 0.3
#: What :func:`sink_masses` measures the mass on: ``<s>``/``[CLS]``, ``</s>``/``[SEP]``, either.
SINK_KEYS = ("bos", "eos", "special")


def _query_mean(s: Tensor, n: Tensor) -> Tensor:
    """A per-query sum over the ``n`` real queries; none is a one-line error."""
    if n == 0:
        raise ValueError("no valid query: query_mask is all False.")
    return s / n


def _mass_sums(attn: Tensor, key_mask: Tensor, query_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Sum over valid queries of the attention mass on ``key_mask`` keys → (Tensor[..., H], n_queries)."""
    if attn.ndim < 4:
        raise ValueError(f"attention must be [..., B, H, Tq, Tk], got {tuple(attn.shape)}.")
    b, tk = attn.shape[-4], attn.shape[-1]
    if tuple(key_mask.shape) != (b, tk):
        raise ValueError(f"key mask must be [B={b}, Tk={tk}], got {tuple(key_mask.shape)}.")
    return _row_sums(attn, lambda a: torch.einsum("...bhqk,bk->...bhq", a, key_mask.to(a.device, torch.float64)),
                     query_mask)


def special_token_attention_mass(attn: Tensor, key_is_special: Tensor | Mapping[str, Tensor],
                                 query_mask: Tensor | None = None) -> Tensor | dict[str, Tensor]:
    r"""Average attention mass that valid queries put on the given keys, per head.

    .. math:: m_h = \frac{1}{|Q|}\sum_{(b,q)\in Q}\ \sum_{k:\ \text{special}(b,k)} A_{b,h,q,k}

    ``attn``: probabilities Tensor[B, H, Tq, Tk] or [L, B, H, Tq, Tk] (e.g. ``torch.stack(outputs.attentions)``).
    ``key_is_special``: Bool[B, Tk], or a mapping name -> Bool[B, Tk] (e.g. ``special_key_masks``) for one result per
    entry.  ``query_mask``: Bool[B, Tq] of the queries to average over (None: all). Returns Tensor[H] (or [L, H])
    float64, or a dict of those for a mapping.
    """
    if isinstance(key_is_special, Mapping):
        return {k: special_token_attention_mass(attn, m, query_mask) for k, m in key_is_special.items()}
    return _query_mean(*_mass_sums(attn, key_is_special, query_mask))


def special_key_masks(input_ids: Tensor, bos_token_id: int | None, eos_token_id: int | None,
                      attention_mask: Tensor | None = None, first_token: bool = False) -> dict[str, Tensor]:
    """``{"bos": ids == bos, "eos": ids == eos, "special": either}`` as Bool[B, T] (padding excluded).

    ``first_token=True`` (decoders): ``bos`` is each sequence's first real token whatever its id — the sink
    of a causal model is the initial token, which every query can see (Xiao et al. 2024; Gu et al. 2025),
    and GPT-2's tokenizer adds no ``<s>`` at all.  A missing id (None) matches no token.
    """
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    bos = first_token_mask(valid) if first_token else (input_ids == bos_token_id) & valid
    eos = (input_ids == eos_token_id) & valid if eos_token_id is not None else torch.zeros_like(valid)
    if bos_token_id is None and not first_token:
        bos = torch.zeros_like(valid)
    return {"bos": bos, "eos": eos, "special": bos | eos}


def first_token_mask(attention_mask: Tensor) -> Tensor:
    """Bool[B, T]: the first non-pad position of each row (position 0 with right padding)."""
    valid = attention_mask.bool()
    return valid & (valid.long().cumsum(-1) == 1)


def later_key_mass(attn: Tensor, query_mask: Tensor | None = None) -> Tensor:
    r"""Per head, the mean attention mass valid queries put on LATER keys (k > q): 0 under a causal mask.

    .. math:: f_{h} = \frac{1}{|Q|}\sum_{(b,q)\in Q}\sum_{k>q} A_{b,h,q,k}

    Checks that a decoder respects its causal mask (for an encoder it is the right-context mass).  ``attn``: Tensor[...,
    B, H, T, T]; ``query_mask``: Bool[B, T] or None (all).  Returns Tensor[..., H] float64.
    """
    t = attn.shape[-1]
    later = torch.ones(t, t, dtype=torch.bool, device=attn.device).triu(1)
    per_query = (attn.detach().to(torch.float64) * later).sum(-1)  # [..., B, H, T]
    b = attn.shape[-4]
    qm = torch.ones(b, t, dtype=torch.float64, device=attn.device) if query_mask is None \
        else query_mask.to(attn.device, torch.float64)
    n = qm.sum()
    if n == 0:
        raise ValueError("no valid query: query_mask is all False.")
    return torch.einsum("...bhq,bq->...h", per_query, qm) / n


class _QueryMean:
    """A per-query statistic summed over batches with the number of queries (float64), so the mean over all queries
    equals the one-shot value; memory O(L·H).  ``shape`` is one result's, ``(H,)`` or ``(L, H)``."""

    def __init__(self, shape: tuple[int, ...]):
        self.sum = torch.zeros(shape, dtype=torch.float64)
        self.n_queries = torch.zeros((), dtype=torch.float64)

    def _add(self, s: Tensor, n: Tensor) -> None:
        if s.shape != self.sum.shape:
            raise ValueError(f"accumulator shape {tuple(self.sum.shape)} does not match result {tuple(s.shape)}.")
        self.sum += s.cpu()
        self.n_queries += n.cpu()

    def compute(self) -> Tensor:
        if self.n_queries == 0:
            raise ValueError(f"{type(self).__name__} is empty.")
        return self.sum / self.n_queries


class AttentionMassAccumulator(_QueryMean):
    """Streaming ``special_token_attention_mass`` over batches."""

    def update(self, attn: Tensor, key_is_special: Tensor, query_mask: Tensor | None = None) -> None:
        self._add(*_mass_sums(attn, key_is_special, query_mask))


def sink_head_share(mass: Tensor, threshold: float = SINK_THRESHOLD) -> Tensor:
    r"""Share of heads whose mean attention on a token exceeds ``threshold`` (Gu et al. 2025, §3).

    .. math:: \text{Sink}_l = \frac1H\sum_{h=1}^{H} \mathbb 1\big[m_{l,h} > \varepsilon\big],
              \qquad \varepsilon = 0.3

    with ``m_{l,h}`` (``mass``, Tensor[..., H]) the mass head h of layer l puts on ``<s>`` (or ``</s>``), averaged over
    the real queries.  Gu et al. report its mean over layers for the first token (18-36% in 60M-parameter models,
    depending on the position encoding).  Strictly greater, as in their definition.  Returns Tensor[...] float64.
    """
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"sink threshold must be in [0, 1), got {threshold}")
    return (mass > threshold).to(torch.float64).mean(-1)


def _row_sums(attn: Tensor, per_row, query_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Σ over real queries of ``per_row(A)`` (a [..., B, H, Tq] value per query row) per head, and the count."""
    if attn.ndim < 4:
        raise ValueError(f"attention must be [..., B, H, Tq, Tk], got {tuple(attn.shape)}.")
    b, _, tq, _ = attn.shape[-4:]
    a = attn.detach().to(torch.float64)
    qm = torch.ones(b, tq, dtype=torch.float64, device=a.device) if query_mask is None \
        else query_mask.to(a.device, torch.float64)
    if tuple(qm.shape) != (b, tq):
        raise ValueError(f"query mask must be [B={b}, Tq={tq}], got {tuple(qm.shape)}.")
    return torch.einsum("...bhq,bq->...h", per_row(a), qm), qm.sum()


def _entropy_sums(attn: Tensor, query_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    # 0·log 0 = 0 for padded keys
    return _row_sums(attn, lambda a: -torch.special.xlogy(a, a).sum(-1), query_mask)


def attention_entropy(attn: Tensor, query_mask: Tensor | None = None) -> Tensor:
    r"""Mean attention entropy per head (nats), over the real queries (``query_mask``, None: all).

    .. math:: E_{l,h} = \frac{1}{|Q|}\sum_{(b,q)\in Q} -\sum_k A^{(l)}_{b,h,q,k}\,\log A^{(l)}_{b,h,q,k}

    0 for a head on one key, log n for one uniform over n keys.  Falling entropy is the signature of sink heads (Gu et
    al. 2025) and of the "entropy collapse" He et al. (2024) link to outlier features. Returns Tensor[H] (or [L, H] for
    a layer axis), float64.
    """
    return _query_mean(*_entropy_sums(attn, query_mask))


def attention_row_mass(attn: Tensor, query_mask: Tensor | None = None) -> Tensor:
    r"""Mean total attention weight of a query row per head, over the real queries.

    .. math:: M_{l,h} = \frac{1}{|Q|}\sum_{(b,q)\in Q} \sum_k A^{(l)}_{b,h,q,k}

    Exactly 1 for softmax.  The clipped softmax of Bondarenko et al. (2023) lets rows sum to less (a head "doing
    nothing"); 0 — possible from initialisation on with small logits and a large |γ|, since clipped probabilities get no
    gradient — means the head attends to nothing.  Shapes as ``attention_entropy``.
    """
    return _query_mean(*_row_sums(attn, lambda a: a.sum(-1), query_mask))


class AttentionEntropyAccumulator(_QueryMean):
    """Streaming ``attention_entropy`` over batches."""

    def update(self, attn: Tensor, query_mask: Tensor | None = None) -> None:
        self._add(*_entropy_sums(attn, query_mask))


def sink_masses(forward_attentions: Callable[[Tensor, Tensor], Sequence[Tensor]],
                batches: Iterable[tuple[Tensor, Tensor]], bos_token_id: int | None, eos_token_id: int | None,
                first_token: bool = False) -> dict[str, Tensor]:
    r"""Per layer and head, the mean attention mass real queries put on ``<s>``, ``</s>`` and on either.

    .. math:: m_{l,h}^{(s)} = \frac{1}{|Q|}\sum_{(b,q)\in Q}\ \sum_{k:\ x_{b,k}=s} A^{(l)}_{b,h,q,k}

    with Q all non-pad query positions (special-token queries included), streamed with ``AttentionMassAccumulator``.
    ``forward_attentions(input_ids, attention_mask)`` returns per-layer attention [B, H, T, T]; ``batches`` yields
    ``(input_ids, attention_mask)``; ``first_token`` (decoders): ``bos`` is each sequence's first token, whatever its
    id.

    Returns ``{"bos", "eos", "special"}`` -> Tensor[L, H] float64, plus ``"entropy"`` (``attention_entropy``, nats) and
    ``"later"`` (``later_key_mass``; 0 under a causal mask) of the same queries.
    """
    accs: dict[str, AttentionMassAccumulator] = {}
    entropy: AttentionEntropyAccumulator | None = None
    later, n_queries = None, 0.0
    for ids, mask in batches:
        attn = torch.stack([a.detach().float().cpu() for a in forward_attentions(ids, mask)])
        keys = special_key_masks(ids, bos_token_id, eos_token_id, mask, first_token=first_token)
        n = float(mask.sum())
        part = later_key_mass(attn, mask.bool()) * n
        later, n_queries = (part if later is None else later + part), n_queries + n
        for k in SINK_KEYS:
            accs.setdefault(k, AttentionMassAccumulator(tuple(attn.shape[:1]) + (attn.shape[2],)))
            accs[k].update(attn, keys[k], query_mask=mask.bool())
        entropy = entropy or AttentionEntropyAccumulator(tuple(attn.shape[:1]) + (attn.shape[2],))
        entropy.update(attn, mask.bool())
    if not accs:
        raise ValueError("no batch to measure attention on")
    return {**{k: a.compute() for k, a in accs.items()}, "entropy": entropy.compute(), "later": later / n_queries}
