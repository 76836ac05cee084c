"""Anisotropy, self-similarity, intra-sentence similarity (Ethayarajh 2019; Luo et al. 2021 §4.1)."""

import itertools

import pytest
import torch

from outlierlab.metrics.similarity import (AnisotropyAccumulator, SelfSimilarityAccumulator, anisotropy,
                                 intra_sentence_similarity, one_token_per_sentence, paired_sentence_tokens,
                                 pairwise_cosine, sample_cross_sentence_pairs, self_similarity)


def _sentences(n_sent: int, seed: int) -> torch.Tensor:
    """sentence id of every token, lengths 1..12, tokens of a sentence contiguous."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 13, (n_sent,), generator=g)
    return torch.repeat_interleave(torch.arange(n_sent), lengths)


def test_cosine_helpers_hand_values():
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    b = torch.tensor([[2.0, 0.0], [-1.0, -1.0], [3.0, 0.0]])
    assert pairwise_cosine(a, b).tolist() == pytest.approx([1.0, -1.0, 0.0])
    an, bn = torch.nn.functional.normalize(a, dim=-1), torch.nn.functional.normalize(b, dim=-1)
    m = an @ an.T  # all-pairs cosine
    assert m[0, 1] == pytest.approx(2 ** -0.5) and m[1, 2] == pytest.approx(2 ** -0.5) and m[0, 2] == pytest.approx(0.0)
    assert torch.allclose((an @ bn.T).diagonal(), pairwise_cosine(a, b))


def test_sampled_pairs_never_same_sentence_nor_same_token():
    sid = _sentences(300, 0)
    a, b = sample_cross_sentence_pairs(sid, 5000, generator=1)
    assert len(a) == len(b) == 5000
    assert (sid[a] != sid[b]).all() and (a != b).all()
    a2, b2 = sample_cross_sentence_pairs(sid, 5000, generator=1)
    assert torch.equal(a, a2) and torch.equal(b, b2)
    with pytest.raises(ValueError, match="2 different sentences"):
        sample_cross_sentence_pairs(torch.zeros(10, dtype=torch.long), 3)


def test_one_token_per_sentence_and_paper_pairing():
    sid = _sentences(2000, 1)
    tok = one_token_per_sentence(sid, 0)
    assert sid[tok].tolist() == list(range(2000))  # exactly one token of each sentence, in order
    picks = torch.stack([one_token_per_sentence(sid, s) for s in range(40)])
    assert picks.unique().numel() > 0.5 * sid.numel()  # the token within a sentence is random
    a, b = paired_sentence_tokens(sid, 0)
    assert len(a) == 1000  # 2000 sentences -> 1000 pairs
    used = torch.cat([sid[a], sid[b]])
    assert used.unique().numel() == 2000 and (sid[a] != sid[b]).all()
    # non-contiguous sentence ids work too
    shuffled = sid[torch.randperm(sid.numel(), generator=torch.Generator().manual_seed(0))]
    assert sorted(shuffled[one_token_per_sentence(shuffled, 3)].tolist()) == list(range(2000))


def test_isotropic_gaussian_has_zero_anisotropy():
    sid = _sentences(2000, 2)
    h = torch.randn(2, sid.numel(), 64, generator=torch.Generator().manual_seed(3))
    a, b = paired_sentence_tokens(sid, 0)
    aniso = anisotropy(h[:, a], h[:, b])
    assert aniso.shape == (2,) and (aniso.abs() < 0.05).all()


def test_common_direction_gives_hand_computed_anisotropy():
    # v = c·u + σ·ε with ‖u‖ = 1, ε ~ N(0, I_d): E cos ≈ c² / (c² + σ² d) = 256 / (256 + 256) = 0.5
    d, c, n = 256, 16.0, 2000
    g = torch.Generator().manual_seed(4)
    u = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    v = c * u + torch.randn(1, n, d, generator=g)
    a, b = paired_sentence_tokens(torch.arange(n), 0)
    assert anisotropy(v[:, a], v[:, b]).item() == pytest.approx(0.5, abs=0.02)


def test_anisotropy_accumulator_matches_expected_values():
    d, c = 256, 16.0
    g = torch.Generator().manual_seed(5)
    u = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    acc_iso = AnisotropyAccumulator(2, d, n_sentences_max=2000, seed=0)
    acc_dir = AnisotropyAccumulator(1, d, n_sentences_max=2000, seed=0)
    for _ in range(100):  # 100 batches x 32 sentences = 3200 sentences > capacity
        sid = torch.repeat_interleave(torch.arange(32), torch.randint(1, 9, (32,), generator=g))
        acc_iso.update(torch.randn(2, sid.numel(), d, generator=g), sid)
        acc_dir.update(c * u + torch.randn(1, sid.numel(), d, generator=g), sid)
    assert acc_iso.n_seen == 3200 and acc_iso.n_kept == 2000 and acc_iso.vectors.shape == (2, 2000, d)
    assert (acc_iso.compute().abs() < 0.05).all()
    assert acc_dir.compute().item() == pytest.approx(0.5, abs=0.02)
    assert torch.equal(acc_dir.compute(), acc_dir.compute())  # compute() is repeatable


def test_reservoir_in_the_models_dtype_loses_nothing_and_one_layer_reads_the_same_pairs():
    # bf16 hidden states (upcast, as the pass hands them over) kept in a bf16 reservoir: the same pairs,
    # bitwise, as a float32 reservoir, at half its size; a layer read alone is that layer of the whole
    g = torch.Generator().manual_seed(8)
    batches = [(torch.randn(3, 40, 16, generator=g).bfloat16().float(), torch.arange(10).repeat_interleave(4))
               for _ in range(6)]
    half = AnisotropyAccumulator(3, 16, n_sentences_max=25, seed=1, dtype=torch.bfloat16)
    full = AnisotropyAccumulator(3, 16, n_sentences_max=25, seed=1)
    for h, sid in batches:
        half.update(h, sid)
        full.update(h, sid)
    assert half.vectors.dtype == torch.bfloat16 and half.vectors.nbytes * 2 == full.vectors.nbytes
    for x, y in zip(half.pair_vectors(), full.pair_vectors()):
        assert x.dtype == torch.float32 and torch.equal(x, y)
    for layer in range(3):
        for x, y in zip(half.pair_vectors(layer), full.pair_vectors()):
            assert x.shape == (1, 12, 16) and torch.equal(x[0], y[layer])
    # a value bf16 cannot hold widens the reservoir to float32 instead of rounding it
    odd = torch.full((3, 4, 16), 1.0 + 2 ** -12)
    half.update(odd, torch.arange(4))
    full.update(odd, torch.arange(4))
    assert half.vectors.dtype == torch.float32 and torch.equal(half.vectors, full.vectors)


def test_anisotropy_reservoir_is_uniform_over_sentences():
    # vectors carry their global sentence id; 100 sentences in 5 batches of 20 into 10 slots:
    # every sentence must be kept with probability 10/100.
    kept = torch.zeros(100)
    trials = 1500
    for seed in range(trials):
        acc = AnisotropyAccumulator(1, 1, n_sentences_max=10, seed=seed)
        for batch in range(5):
            sid = torch.arange(20).repeat_interleave(2)  # 2 tokens per sentence
            acc.update((batch * 20 + sid).float().view(1, -1, 1), sid)
        ids = acc.vectors[0, :, 0].long()
        assert ids.unique().numel() == 10
        kept[ids] += 1
    freq = kept / trials
    assert (freq - 0.1).abs().max() < 0.035  # binomial sd ≈ 0.0077


def test_self_similarity_known_values():
    e1, e2 = torch.eye(4)[0], torch.eye(4)[1]
    same = torch.stack([e1, 2 * e1, 0.5 * e1]).unsqueeze(0)
    assert self_similarity(same).item() == pytest.approx(1.0)
    assert self_similarity(same, torch.tensor([0.2])).item() == pytest.approx(0.8)
    # 3 vectors along e1 and 2 along e2: C(3,2)+C(2,2) = 4 of C(5,2) = 10 pairs have cosine 1
    groups = torch.stack([e1, 3 * e1, e1, e2, 5 * e2]).unsqueeze(0)
    assert self_similarity(groups).item() == pytest.approx(0.4)
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(6))
    brute = torch.stack([torch.stack([torch.cosine_similarity(x[l, i], x[l, j], dim=0)
                                      for i, j in itertools.combinations(range(7), 2)]).mean() for l in range(3)])
    assert torch.allclose(self_similarity(x), brute.double(), atol=1e-6)


def test_self_similarity_accumulator_streams():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 6, (400,), generator=g)
    h = torch.randn(2, 400, 8, generator=g)
    acc = SelfSimilarityAccumulator(2, 8, keys=[1, 3, 5, 99])
    for s in torch.split(torch.arange(400), 57):
        acc.update(h[:, s], ids[s])
    keys, vals = acc.compute(min_occurrences=2)
    assert keys.tolist() == [1, 3, 5]  # 99 never seen; 0, 2, 4 are not targets
    for j, k in enumerate(keys.tolist()):
        assert torch.allclose(vals[:, j], self_similarity(h[:, ids == k]), atol=1e-9)
    n3 = int((ids == 3).sum())
    keys_hi, _ = acc.compute(min_occurrences=n3 + 1)
    assert 3 not in keys_hi.tolist()
    _, adj = acc.compute(min_occurrences=2, anisotropy=torch.tensor([0.1, 0.2]))
    assert torch.allclose(adj, vals - torch.tensor([[0.1], [0.2]], dtype=torch.float64))
    # compact: [L, K] squared norms instead of [L, K, d] sums, bitwise the same values; no update after it
    assert acc.compact().sum_unit is None and acc.sum_norm_sq.shape == (2, 4)
    keys_c, vals_c = acc.compute(min_occurrences=2)
    assert torch.equal(keys_c, keys) and torch.equal(vals_c, vals)
    with pytest.raises(ValueError, match="compacted"):
        acc.update(h[:, :3], ids[:3])


def test_intra_sentence_similarity_hand_and_masked():
    e = torch.eye(3)
    two = torch.stack([e[0], e[1]]).unsqueeze(0)  # mean (e1+e2)/2: each token has cosine 1/√2 with it
    assert intra_sentence_similarity(two).item() == pytest.approx(2 ** -0.5)
    assert intra_sentence_similarity(torch.ones(1, 4, 3)).item() == pytest.approx(1.0)
    assert intra_sentence_similarity(two, torch.tensor([0.5])).item() == pytest.approx(2 ** -0.5 - 0.5)
    g = torch.Generator().manual_seed(8)
    h = torch.randn(2, 3, 6, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    batched = intra_sentence_similarity(h, mask=mask)
    assert batched.shape == (2, 3)
    for b in range(3):
        assert torch.allclose(batched[:, b], intra_sentence_similarity(h[:, b, mask[b]]), atol=1e-9)


def _intra_torch_formula(v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """intra_sentence_similarity written the plain way: F.cosine_similarity against the expanded centre."""
    import torch.nn.functional as F
    if mask is None:
        return F.cosine_similarity(v, v.mean(-2, keepdim=True), dim=-1, eps=1e-8).to(torch.float64).mean(-1)
    m = mask.to(v.dtype)
    n = m.sum(-1)
    centre = (v * m[..., None]).sum(-2, keepdim=True) / n[:, None, None]
    return (F.cosine_similarity(v, centre, dim=-1, eps=1e-8) * m).sum(-1, dtype=torch.float64) / n.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_intra_sentence_similarity_equals_cosine_similarity_formula_bitwise(dtype):
    """The centre's unit vector computed once gives F.cosine_similarity's numbers bitwise: random sentences,
    a one-word sentence, a zero vector (eps), an all-zero sentence, padding holding garbage, ties."""
    g = torch.Generator().manual_seed(11)
    h = torch.randn(3, 5, 7, 16, generator=g).to(dtype) * torch.rand(1, 5, 7, 1, generator=g).to(dtype) * 50
    mask = torch.tensor([[1] * 7, [1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0], [1] * 7, [0, 1, 0, 1, 0, 1, 1]],
                        dtype=torch.bool)
    h[:, 2, 1] = 0.0  # a zero word vector: cosine 0 through eps
    h[:, 3] = 0.0  # an all-zero sentence: a zero centre
    h[:, 4, 3] = h[:, 4, 5]  # two equal vectors
    h[:, 1, 3:] = 1e6  # padding with huge values, masked out
    assert torch.equal(intra_sentence_similarity(h, mask=mask), _intra_torch_formula(h, mask))
    for b in range(5):
        one = h[:, b, mask[b]]
        assert torch.equal(intra_sentence_similarity(one), _intra_torch_formula(one, None))
    one_word = intra_sentence_similarity(h[:, 1, :1])  # a one-word sentence: cos(v, v) = 1 up to rounding
    assert torch.equal(one_word, _intra_torch_formula(h[:, 1, :1], None))
    assert torch.allclose(one_word, torch.ones(3, dtype=torch.float64), atol=1e-6)
    assert torch.equal(intra_sentence_similarity(h[:, 3]), torch.zeros(3, dtype=torch.float64))
    # the definition by hand: each token's cosine with the mean vector, averaged
    v = h[:, 2, :3].double()
    c = v.mean(1, keepdim=True)
    hand = ((v * c).sum(-1) / (v.norm(dim=-1).clamp_min(1e-8) * c.norm(dim=-1).clamp_min(1e-8))).mean(-1)
    assert torch.allclose(intra_sentence_similarity(h[:, 2, :3]), hand, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_self_similarity_update_equals_normalize_formula_bitwise_and_leaves_input_alone(dtype):
    """The in-place float64 normalisation gives F.normalize's unit vectors and ``u.pow(2).sum(-1)`` bitwise
    (the plain formula): all rows targets (no gather) or mixed with non-targets, a word twice in a
    call, a zero vector (eps); the caller's tensor (float64: no copy made by ``.to``) is not modified."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(12)
    h = (torch.randn(2, 9, 16, generator=g) * 30).to(dtype)
    h[:, 4] = 0.0
    ids = torch.tensor([5, 2, 5, 9, 2, 7, 3, 2, 9])
    for rows in (torch.tensor([0, 1, 2, 3, 4, 6, 7, 8]), torch.arange(9)):  # all targets / with non-target 7
        x = h[:, rows]
        before = x.clone()
        acc = SelfSimilarityAccumulator(2, 16, keys=[2, 3, 5, 9])
        acc.update(x, ids[rows])
        assert torch.equal(x, before)  # float64: ``.to`` alone would not copy it
        ref_unit = torch.zeros(2, 4, 16, dtype=torch.float64)
        ref_sq = torch.zeros(2, 4, dtype=torch.float64)
        slot = {2: 0, 3: 1, 5: 2, 9: 3}
        for r in rows.tolist():
            if ids[r].item() in slot:
                u = F.normalize(h[:, r].to(torch.float64), dim=-1, eps=1e-8)
                ref_unit[:, slot[ids[r].item()]] += u
                ref_sq[:, slot[ids[r].item()]] += u.pow(2).sum(-1)
        assert torch.equal(acc.sum_unit, ref_unit) and torch.equal(acc.sum_sq, ref_sq)
        assert acc.counts.tolist() == [3, 1, 2, 2]
    acc.update(h[:, :0], ids[:0])  # nothing
    acc.update(h[:, 5:6], ids[5:6])  # no target
    assert acc.counts.tolist() == [3, 1, 2, 2]
