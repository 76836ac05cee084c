"""Geometry of contextual vector spaces: anisotropy, self-similarity, intra-sentence similarity.

Definitions from Ethayarajh (2019), "How Contextual are Contextualized Word Representations?", as used
by Luo et al. (2021) §4.1 (2000 sentences → 1000 cross-sentence pairs, one random token per sentence).
All functions take batched layers ``[L, ..., d]`` and return one value per layer.  Cosines are computed
in at least float32 (half-precision inputs are upcast); reductions in float64 where they stream.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["pairwise_cosine", "one_token_per_sentence", "paired_sentence_tokens",
           "sample_cross_sentence_pairs", "anisotropy", "AnisotropyAccumulator", "self_similarity",
           "intra_sentence_similarity", "SelfSimilarityAccumulator"]

_EPS = 1e-8


def _gen(generator: torch.Generator | int | None) -> torch.Generator | None:
    return torch.Generator().manual_seed(generator) if isinstance(generator, int) else generator


def _f(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def pairwise_cosine(a: Tensor, b: Tensor, eps: float = _EPS) -> Tensor:
    """Row-wise cosine of paired vectors: ``cos(a[..., p, :], b[..., p, :])`` → Tensor[..., P]."""
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"vector sizes differ: {tuple(a.shape)} vs {tuple(b.shape)}.")
    return F.cosine_similarity(_f(a), _f(b), dim=-1, eps=eps)


def one_token_per_sentence(sentence_ids: Tensor, generator: torch.Generator | int | None = None) -> Tensor:
    """Index of one uniformly random token of every sentence: LongTensor[S] on CPU, by ascending sentence id.

    ``sentence_ids`` (LongTensor[N]) gives each token's sentence (any ids; tokens of a sentence need not be contiguous).
    """
    sid = sentence_ids.detach().flatten().cpu()
    if sid.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    order = torch.randperm(sid.numel(), generator=_gen(generator))
    order = order[torch.argsort(sid[order], stable=True)]  # random order within each sentence
    _, counts = torch.unique_consecutive(sid[order], return_counts=True)
    return order[torch.cumsum(counts, 0) - counts]  # first (= random) token of each sentence


def paired_sentence_tokens(sentence_ids: Tensor, generator: torch.Generator | int | None = None
                           ) -> tuple[Tensor, Tensor]:
    """Luo et al. §4.1 / Ethayarajh's sampling: one random token per sentence, sentences shuffled and paired two by two,
    so S sentences give ⌊S/2⌋ pairs ``(idx_a, idx_b)`` (LongTensor each, CPU) from different sentences."""
    g = _gen(generator)
    tok = one_token_per_sentence(sentence_ids, g)
    if tok.numel() < 2:
        raise ValueError(f"need tokens from at least 2 sentences to form a pair, got {tok.numel()}.")
    tok = tok[torch.randperm(tok.numel(), generator=g)]
    n = tok.numel() // 2
    return tok[0:2 * n:2], tok[1:2 * n:2]


def sample_cross_sentence_pairs(sentence_ids: Tensor, n_pairs: int,
                                generator: torch.Generator | int | None = None) -> tuple[Tensor, Tensor]:
    """``n_pairs`` random token pairs ``(idx_a, idx_b)`` (uniform over tokens, with replacement) from different
    sentences.

    Rejection sampling: a pair never joins a token with itself nor two tokens of one sentence.  For the paper's protocol
    (one token per sentence) use ``paired_sentence_tokens``.
    """
    sid = sentence_ids.detach().flatten().cpu()
    if sid.unique().numel() < 2:
        raise ValueError("need tokens from at least 2 different sentences to sample cross-sentence pairs.")
    g, n = _gen(generator), sid.numel()
    got_a, got_b, total = [], [], 0
    for _ in range(10_000):
        if total >= n_pairs:
            break
        m = 2 * (n_pairs - total) + 16
        a = torch.randint(n, (m,), generator=g)
        b = torch.randint(n, (m,), generator=g)
        keep = sid[a] != sid[b]
        got_a.append(a[keep]), got_b.append(b[keep])
        total += int(keep.sum())
    else:
        raise ValueError("could not sample enough cross-sentence pairs: almost all tokens share one sentence.")
    return torch.cat(got_a)[:n_pairs], torch.cat(got_b)[:n_pairs]


def anisotropy(vectors_a: Tensor, vectors_b: Tensor) -> Tensor:
    r"""Mean cosine of random token pairs from different sentences (Ethayarajh 2019; Luo et al. §4.1).

    .. math:: \text{aniso}_l = \tfrac1P\sum_{p=1}^P \cos(a_{l,p}, b_{l,p})

    ``vectors_a, vectors_b``: Tensor[L, P, d] (or [P, d]), e.g. ``hidden[:, idx_a]`` from ``paired_sentence_tokens``.
    Returns Tensor[L] (or scalar): ≈ 0 for an isotropic space, → 1 when all vectors share a direction.
    """
    if vectors_a.shape != vectors_b.shape:
        raise ValueError(f"paired vectors differ in shape: {tuple(vectors_a.shape)} vs {tuple(vectors_b.shape)}.")
    return pairwise_cosine(vectors_a, vectors_b).mean(-1)


class AnisotropyAccumulator:
    """Streaming anisotropy with the paper's sampling (one random token per sentence).

    Each ``update`` offers one random token of every sentence to a reservoir of ``n_sentences_max`` slots (paper: 2000;
    Vitter's Algorithm R over sentences, so the kept sentences are a uniform subset).  Memory is ``n_sentences_max × L ×
    d``, independent of the token count.  ``compute`` shuffles the kept sentences with a fixed permutation (``seed +
    1``), pairs them and returns ``anisotropy`` per layer — 2000 sentences → 1000 pairs, as in Luo et al. §4.1.
    ``seed`` fixes token choice and replacement.  ``dtype`` may be the model's own (bf16 loses nothing and halves the
    reservoir: 2.5 GiB instead of 4.9 at 70B); ``pair_vectors`` returns float32 either way.

    Not SUM-reducible across DDP ranks: run it on one rank, or gather each rank's ``pair_vectors``.
    """

    #: Running tensors with one row per layer (:func:`outlierlab.metrics.layer_accumulators.stack_layers`).
    LAYER_STATE = ("vectors",)

    def own_layer_view(self) -> None:
        """A single-layer view draws the same tokens as the whole: its own generator, the same seed and calls."""
        self._gen = torch.Generator().manual_seed(self.seed)

    def __init__(self, num_layers: int, dim: int, n_sentences_max: int = 2000, seed: int = 0,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32):
        if n_sentences_max < 2:
            raise ValueError(f"n_sentences_max must be >= 2 to form a pair, got {n_sentences_max}.")
        self.num_layers, self.dim, self.capacity, self.seed = num_layers, dim, int(n_sentences_max), seed
        self.vectors = torch.zeros(num_layers, self.capacity, dim, dtype=dtype,
                                   device=torch.device("cpu") if device is None else device)
        self.n_seen = 0
        self._gen = torch.Generator().manual_seed(seed)

    @property
    def n_kept(self) -> int:
        return min(self.n_seen, self.capacity)

    def update(self, hidden: Tensor, sentence_ids: Tensor) -> None:
        """Offer the sentences of one batch: ``hidden`` Tensor[L, N, d] of valid tokens only.

        ``sentence_ids`` (LongTensor[N]) is each token's sentence within this call; different calls never share
        sentences.
        """
        if hidden.ndim != 3 or hidden.shape[0] != self.num_layers or hidden.shape[2] != self.dim:
            raise ValueError(f"hidden must be [L={self.num_layers}, N, d={self.dim}], got {tuple(hidden.shape)}.")
        if sentence_ids.numel() != hidden.shape[1]:
            raise ValueError(f"sentence_ids has {sentence_ids.numel()} entries for {hidden.shape[1]} tokens.")
        tok = one_token_per_sentence(sentence_ids, self._gen)
        s = tok.numel()
        if s == 0:
            return
        t = torch.arange(self.n_seen, self.n_seen + s, dtype=torch.float64)
        # Algorithm R: sentence number t goes to slot t while the reservoir fills, afterwards to a
        # uniform slot j in [0, t] and is kept only if j < capacity.
        j = torch.where(t < self.capacity, t, torch.floor(torch.rand(s, generator=self._gen, dtype=torch.float64) * (t + 1)))
        j = j.long()
        keep = (j < self.capacity).nonzero().flatten()
        if keep.numel():
            slots, inv = torch.unique(j[keep], return_inverse=True)
            # several sentences of this batch may hit one slot: the later one wins, as in sequential R
            last = torch.full((slots.numel(),), -1, dtype=torch.long).scatter_reduce(0, inv, keep, "amax")
            src = tok[last].to(hidden.device)
            new = hidden.detach()[:, src]
            if self.vectors.dtype != new.dtype and not torch.equal(new.to(self.vectors.dtype).to(new.dtype), new):
                self.vectors = self.vectors.float()  # a value the narrower dtype cannot hold: widen, lose nothing
            self.vectors[:, slots.to(self.vectors.device)] = new.to(self.vectors)
        self.n_seen += s

    def pair_vectors(self, layer: int | None = None) -> tuple[Tensor, Tensor]:
        """The kept vectors, shuffled (fixed seed) and paired: two float32 Tensor[L, ⌊n_kept/2⌋, d], or with ``layer``
        the same pairs of that layer alone ([1, ...])."""
        n = self.n_kept
        if n < 2:
            raise ValueError(f"anisotropy needs at least 2 sentences, got {n}.")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + 1)).to(self.vectors.device)
        rows = self.vectors[:, :n] if layer is None else self.vectors[layer:layer + 1, :n]
        v = rows[:, perm].float()
        m = n // 2
        return v[:, 0:2 * m:2], v[:, 1:2 * m:2]

    def compute(self) -> Tensor:
        """Anisotropy per layer, Tensor[L] (float32)."""
        return anisotropy(*self.pair_vectors())


def self_similarity(vectors: Tensor, anisotropy: Tensor | None = None) -> Tensor:
    r"""Self-similarity of one word: mean cosine over distinct pairs of its occurrences (Ethayarajh 2019).

    .. math:: \text{SelfSim}_l(w) = \frac{1}{n(n-1)/2}\sum_{i<j}\cos(v_{l,i}, v_{l,j})
              \;-\; \text{aniso}_l

    computed as ``(\lVert\sum_i u_i\rVert^2 - \sum_i \lVert u_i\rVert^2) / (n(n-1))`` with ``u_i = v_i/\lVert
    v_i\rVert`` (no n×n matrix).  ``vectors``: Tensor[L, n_occ, d] (or [n_occ, d]), n_occ ≥ 2 sentences (Ethayarajh: ≥
    5; DESIGN: ≥ 10).  ``anisotropy`` is Ethayarajh's baseline (None: raw).  Returns Tensor[L] float64.
    """
    if vectors.shape[-2] < 2:
        raise ValueError(f"self-similarity needs at least 2 occurrences, got {vectors.shape[-2]}.")
    u = F.normalize(vectors.to(torch.float64), dim=-1, eps=_EPS)
    n = u.shape[-2]
    out = (u.sum(-2).pow(2).sum(-1) - u.pow(2).sum((-1, -2))) / (n * (n - 1))
    return out if anisotropy is None else out - anisotropy.to(out)


def intra_sentence_similarity(vectors: Tensor, anisotropy: Tensor | None = None,
                              mask: Tensor | None = None) -> Tensor:
    r"""Mean cosine between each token of a sentence and the sentence's mean vector (Ethayarajh 2019).

    .. math:: \text{IntraSim}_l(s) = \frac1n\sum_{i=1}^n \cos(\bar v_{l}, v_{l,i}) - \text{aniso}_l,
              \qquad \bar v_l = \frac1n\sum_i v_{l,i}

    ``vectors``: Tensor[L, n_tok, d] (one sentence → Tensor[L]) or Tensor[L, B, T, d] with ``mask`` Bool[B, T] of valid
    tokens (→ Tensor[L, B]), float64.  ``anisotropy`` (Tensor[L]) is subtracted per layer; None gives the raw value.
    """
    # cosines in the vectors' precision (float32 for a model's states, relative error ~1e-7 per cosine),
    # averaged in float64: float64 copies of every word vector cost 6x the float32 cosines
    v = vectors if vectors.dtype == torch.float64 else vectors.float()
    if mask is None:
        out = _cosine_to_centre(v, v.mean(-2, keepdim=True)).to(torch.float64).mean(-1)
    else:
        if v.ndim != 4 or tuple(v.shape[1:3]) != tuple(mask.shape):
            raise ValueError(f"with a mask, vectors must be [L, B, T, d] matching mask [B, T]; "
                             f"got {tuple(v.shape)} and {tuple(mask.shape)}.")
        m = mask.to(v.device, v.dtype)
        n = m.sum(-1)
        if (n == 0).any():
            raise ValueError("every sentence needs at least one valid token for intra-sentence similarity.")
        centre = (v * m[..., None]).sum(-2, keepdim=True) / n[:, None, None]
        out = (_cosine_to_centre(v, centre) * m).sum(-1, dtype=torch.float64) / n.double()
    if anisotropy is None:
        return out
    a = anisotropy.to(out)
    return out - (a if out.ndim == 1 else a[:, None])


def _cosine_to_centre(v: Tensor, centre: Tensor) -> Tensor:
    """``F.cosine_similarity(v, centre, dim=-1, eps=_EPS)`` for ``centre [..., 1, d]``, bitwise, but with the centre's
    norm computed once rather than on its expanded copy (0.67 vs 0.97 ms for [1, 32, 60, 384] on one core)."""
    v_norm = torch.linalg.vector_norm(v, 2, dim=-1, keepdim=True).clamp_min_(_EPS)
    c_norm = torch.linalg.vector_norm(centre, 2, dim=-1, keepdim=True).clamp_min_(_EPS)
    return (v / v_norm).mul_(centre / c_norm).sum(-1)


class SelfSimilarityAccumulator:
    """Streaming ``self_similarity`` for a fixed set of target words ``keys`` (token or word-type ids).

    Keeps, per word and layer, the float64 sum of unit vectors, the sum of squared norms and the count (``L × K × d``);
    ``compact`` then keeps only each sum's squared norm (``L × K``: 4.9 GiB → 0.6 MiB for 1000 words at 70B).
    Occurrences count separately: to follow Ethayarajh, feed at most one per sentence; multi-token words are pooled by
    the caller.
    """

    #: Running tensors with one row per layer (:func:`outlierlab.metrics.layer_accumulators.stack_layers`).
    LAYER_STATE = ("sum_unit", "sum_sq", "sum_norm_sq")

    def own_layer_view(self) -> None:
        """A single-layer view counts the occurrences itself (once, not once per layer of the whole)."""
        self.counts = self.counts.clone()

    def __init__(self, num_layers: int, dim: int, keys: Sequence[int], device: torch.device | str | None = None):
        self.keys = torch.as_tensor(list(keys), dtype=torch.long).unique()
        if self.keys.numel() == 0:
            raise ValueError("SelfSimilarityAccumulator needs at least one target word id.")
        dev = torch.device("cpu") if device is None else torch.device(device)
        self.num_layers, self.dim = num_layers, dim
        k = self.keys.numel()
        self.sum_unit: Tensor | None = torch.zeros(num_layers, k, dim, dtype=torch.float64, device=dev)
        self.sum_sq = torch.zeros(num_layers, k, dtype=torch.float64, device=dev)
        self.sum_norm_sq: Tensor | None = None  # ‖Σ u‖² per word, [L, K], once compact()
        self.counts = torch.zeros(k, dtype=torch.long, device=dev)

    def compact(self) -> "SelfSimilarityAccumulator":
        """Keep ``‖Σ u‖²`` per word and layer instead of ``Σ u`` (``[L, K]`` instead of ``[L, K, d]``): all
        ``compute`` reads, the same numbers; no ``update`` after it.  Returns self."""
        if self.sum_unit is not None:
            self.sum_norm_sq = self.sum_unit.pow(2).sum(-1)
            self.sum_unit = None
        return self

    def update(self, hidden: Tensor, word_ids: Tensor) -> None:
        """Add occurrences: ``hidden`` Tensor[L, N, d] and ``word_ids`` LongTensor[N] (non-targets ignored)."""
        if hidden.ndim != 3 or hidden.shape[0] != self.num_layers or hidden.shape[2] != self.dim:
            raise ValueError(f"hidden must be [L={self.num_layers}, N, d={self.dim}], got {tuple(hidden.shape)}.")
        ids = word_ids.detach().flatten().cpu()
        if ids.numel() != hidden.shape[1]:
            raise ValueError(f"word_ids has {ids.numel()} entries for {hidden.shape[1]} vectors.")
        pos = torch.searchsorted(self.keys, ids).clamp_max(self.keys.numel() - 1)
        hit = (self.keys[pos] == ids).nonzero().flatten()
        if hit.numel() == 0:
            return
        if self.sum_unit is None:
            raise ValueError("this SelfSimilarityAccumulator was compacted: it takes no more occurrences")
        dev = self.sum_unit.device
        h = hidden.detach()
        # every row a target (what the sentence pass passes): no gather.  The float64 copy is ours, so
        # F.normalize's division and the squares are done in it in place — the same numbers
        x = h if hit.numel() == ids.numel() else h[:, hit.to(h.device)]
        x = x.to(torch.float64, copy=True)
        u = x.div_(x.norm(2.0, -1, keepdim=True).clamp_min(_EPS)).to(dev)  # = F.normalize(x, dim=-1, eps=_EPS)
        p = pos if hit.numel() == ids.numel() else pos[hit]
        p = p.to(dev)
        self.sum_unit.index_add_(1, p, u)
        self.sum_sq.index_add_(1, p, u.mul_(u).sum(-1))  # = u.pow(2).sum(-1); u is not read after this
        self.counts.index_add_(0, p, torch.ones_like(p))

    def compute(self, min_occurrences: int = 10, anisotropy: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Self-similarity of every word seen ≥ ``min_occurrences`` (≥ 2) times.

        Returns ``(keys LongTensor[K'], values Tensor[L, K'] float64)``; average over words with ``values.mean(1)``.
        """
        sel = (self.counts >= max(2, min_occurrences)).nonzero().flatten()
        n = self.counts[sel].to(torch.float64)
        norm_sq = self.sum_unit[:, sel].pow(2).sum(-1) if self.sum_unit is not None else self.sum_norm_sq[:, sel]
        out = (norm_sq - self.sum_sq[:, sel]) / (n * (n - 1))
        if anisotropy is not None:
            out = out - anisotropy.to(out)[:, None]
        return self.keys[sel.cpu()], out
