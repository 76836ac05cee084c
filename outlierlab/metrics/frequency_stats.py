"""Token frequency vs outlier-dimension magnitude (Puccetti et al. 2022, "Outlier Dimensions that Disrupt
Transformers Are Driven by Frequency").

Per token type: the mean value of each outlier dim over the type's occurrences; then, per layer and
dim, Spearman's ρ between type frequency and that mean.  Puccetti et al. find outlier magnitude
strongly rank-correlated with how frequent the token was in pretraining.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from outlierlab.metrics.sts_scores import spearman_columns

__all__ = ["TokenValueAccumulator", "token_frequency_spearman", "FrequencyTable", "frequency_table"]


class TokenValueAccumulator:
    """Streaming per-token-type float64 sums of selected dims (``index_add`` by token id). Memory ``L × vocab_size ×
    n_dims``: select the outlier dims first."""

    def __init__(self, vocab_size: int, num_layers: int, n_dims: int, device: torch.device | str | None = None):
        dev = torch.device("cpu") if device is None else torch.device(device)
        self.vocab_size, self.num_layers, self.n_dims = vocab_size, num_layers, n_dims
        self.sum = torch.zeros(num_layers, vocab_size, n_dims, dtype=torch.float64, device=dev)
        self.counts = torch.zeros(vocab_size, dtype=torch.long, device=dev)

    def update(self, token_ids: Tensor, values: Tensor) -> None:
        """Add occurrences: ``token_ids`` LongTensor[N] (valid tokens only), ``values`` [L, N, n_dims]."""
        ids = token_ids.detach().flatten().to(self.sum.device, torch.long)
        if values.ndim != 3 or values.shape[0] != self.num_layers or values.shape[2] != self.n_dims \
                or values.shape[1] != ids.numel():
            raise ValueError(f"values must be [L={self.num_layers}, N={ids.numel()}, n_dims={self.n_dims}], "
                             f"got {tuple(values.shape)}.")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}).")
        self.sum.index_add_(1, ids, values.detach().to(self.sum.device, torch.float64))
        self.counts.index_add_(0, ids, torch.ones_like(ids))

    def result(self, min_count: int = 1) -> tuple[Tensor, Tensor, Tensor]:
        """Token types seen ≥ ``min_count`` times: ``(token_ids [V_seen], counts [V_seen], means [L, V_seen, n_dims]
        float64)``."""
        seen = (self.counts >= max(1, min_count)).nonzero().flatten()
        c = self.counts[seen]
        return seen, c, self.sum[:, seen] / c[None, :, None].to(torch.float64)


def token_frequency_spearman(freqs: Tensor, values: Tensor) -> Tensor:
    r"""Spearman ρ between token-type frequency and the per-type mean value of each dim, per layer.

    .. math:: \rho_{l,j} = \operatorname{spearman}_{v \in V_\text{seen}}\big(f_v,\ \bar h_{l,v,j}\big)

    (Puccetti et al. 2022.)  torchmetrics' Spearman (average ranks for ties); NaN where a side is constant. ``freqs``
    [V_seen], ``values`` [L, V_seen, n_dims] (or [V_seen, n_dims]) -> [L, n_dims] float64.
    """
    squeeze = values.ndim == 2
    v = values.unsqueeze(0) if squeeze else values
    if v.ndim != 3 or v.shape[1] != freqs.numel():
        raise ValueError(f"values must be [L, V_seen={freqs.numel()}, n_dims], got {tuple(values.shape)}.")
    L, V, n = v.shape
    rho = spearman_columns(v.permute(1, 0, 2).reshape(V, L * n), freqs.to(torch.float64)).reshape(L, n)
    return rho[0] if squeeze else rho


@dataclass
class FrequencyTable:
    """Per seen token type: id, occurrences in the evaluated text, frequency, mean outlier values; and ρ."""

    type_ids: np.ndarray  # [V_seen]
    occurrences: np.ndarray  # [V_seen]
    freqs: np.ndarray  # [V_seen] frequency used for the correlation
    means: Tensor  # [L, V_seen, n_dims] float64
    rho: Tensor  # [L, n_dims] float64 (NaN where undefined)
    dims: list[int]


def frequency_table(chunks: Iterable[tuple[np.ndarray | Tensor, Tensor]], dims: Sequence[int],
                       freq_counts: np.ndarray, min_occurrences: int = 1, magnitude: bool = True,
                       picked: bool = False) -> FrequencyTable:
    """Per-type mean of each outlier dim, its frequency, and Spearman ρ per layer × dim (Puccetti et al. 2022).

    With ``magnitude`` the per-type value is the mean |h_j|, the magnitude Puccetti et al. correlate with frequency (a
    large negative dim then correlates positively); otherwise the signed mean.  ``chunks`` yields ``(token_ids [n],
    values [L, n, d])`` of the analysed (non-special) tokens, or only the ``dims`` columns when ``picked``.
    ``freq_counts`` [vocab] defines the id space; types seen fewer than ``min_occurrences`` times are left out.
    """
    dims = [int(d) for d in dims]
    if not dims:
        raise ValueError("no dims to correlate with frequency")
    freq_counts = np.asarray(freq_counts)
    acc = None
    for ids, values in chunks:
        if acc is None:  # float64 sums over the vocabulary, only for the chosen dims
            acc = TokenValueAccumulator(len(freq_counts), values.shape[0], len(dims))
        cols = (values if picked else values[..., dims]).cpu()
        acc.update(torch.as_tensor(np.asarray(ids), dtype=torch.long), cols.abs() if magnitude else cols)
    if acc is None or int(acc.counts.sum()) == 0:
        raise ValueError("no token to analyse (empty text?)")
    seen, occ, means = acc.result(min_occurrences)
    type_ids = seen.numpy()
    freqs = freq_counts[type_ids]
    rho = token_frequency_spearman(torch.from_numpy(freqs.astype(np.float64)), means)
    return FrequencyTable(type_ids, occ.numpy(), freqs, means, rho, dims)
