"""WiC threshold sweep, STS Spearman, attention mass on special tokens, frequency correlation."""

import math

import pytest
import torch
from scipy.stats import spearmanr

from sentence_pass_oracle import mean_pool
from outlierlab.metrics.attention_mass import AttentionMassAccumulator, special_key_masks, special_token_attention_mass
from outlierlab.metrics.frequency_stats import TokenValueAccumulator, token_frequency_spearman
from outlierlab.metrics.sts_scores import spearman_columns, sts_spearman
from outlierlab.metrics.wic_thresholds import (all_true_baseline, best_per_layer, best_threshold, choose_then_report, default_thresholds,
                          threshold_sweep, wic_accuracy)


def test_wic_sweep_picks_the_right_threshold():
    labels = torch.tensor([True] * 6 + [False] * 4)
    # layer 0: positives 0.75 (one at 0.68), negatives 0.65 -> best 0.7 with 9/10
    # layer 1: positives 0.35, negatives 0.25 -> only threshold 0.3 separates: 10/10
    l0 = torch.tensor([0.75] * 5 + [0.68] + [0.65] * 4)
    l1 = torch.tensor([0.35] * 6 + [0.25] * 4)
    acc = threshold_sweep(torch.stack([l0, l1]), labels)
    assert acc.shape == (2, 9)
    assert acc[1].tolist() == pytest.approx([0.6, 0.6, 1.0, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4])
    assert acc[0].tolist() == pytest.approx([0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.9, 0.4, 0.4])
    assert best_threshold(acc) == (1, pytest.approx(0.3), 1.0)
    thr, best = best_per_layer(acc)
    assert thr.tolist() == pytest.approx([0.7, 0.3]) and best.tolist() == pytest.approx([0.9, 1.0])
    assert all_true_baseline(labels) == 0.6 == acc[0, 0]  # threshold below every cosine = all "same"
    assert wic_accuracy(torch.stack([l0, l1]), labels, torch.tensor([0.7, 0.3])).tolist() == pytest.approx([0.9, 1.0])
    assert wic_accuracy(l1, labels, 0.5).tolist() == pytest.approx([0.4])
    assert default_thresholds()[2].item() == 0.3


def test_wic_choose_on_train_report_on_test_never_uses_test_labels():
    """Train wants a threshold in [0.2, 0.4) (same-sense cosines 0.4, others 0.2; ties -> 0.2), test wants one in
    [0.6, 0.8): the honest protocol applies 0.2 to test (accuracy 0.5, every pair called "same"), whatever the
    test labels are."""
    train_cos = torch.tensor([[0.4, 0.4, 0.2, 0.2], [0.5, 0.1, 0.5, 0.1]], dtype=torch.float64)  # layer 1: useless
    train_lab = torch.tensor([True, True, False, False])
    test_cos = torch.tensor([[0.8, 0.8, 0.6, 0.6], [0.9, 0.9, 0.9, 0.9]], dtype=torch.float64)
    test_lab = torch.tensor([True, True, False, False])
    out = choose_then_report(train_cos, train_lab, test_cos, test_lab)
    assert out["threshold"][0] == pytest.approx(0.2) and out["choose_accuracy"][0] == 1.0  # ties -> lowest of 0.2, 0.3
    assert (out["best_layer"], out["best_threshold"]) == (0, pytest.approx(0.2))
    assert out["report_accuracy"][0] == pytest.approx(0.5) and out["best_report_accuracy"] == pytest.approx(0.5)
    # the test split's own sweep would pick 0.6 and score 1.0: the honest number is not that
    assert float(threshold_sweep(test_cos[0], test_lab).max()) == 1.0
    # the choice does not move when the test labels do (they are only scored)
    for flipped in (~test_lab, torch.tensor([True, False, True, False])):
        again = choose_then_report(train_cos, train_lab, test_cos, flipped)
        assert torch.equal(again["threshold"], out["threshold"]) and again["best_layer"] == out["best_layer"]
        assert again["report_accuracy"][0] == pytest.approx(float(((test_cos[0] > 0.2) == flipped).double().mean()))


def test_sts_spearman_matches_scipy_and_flags_constant_layer():
    g = torch.Generator().manual_seed(0)
    gold = torch.tensor([0.0, 1.0, 1.0, 2.5, 3.0, 4.0, 4.0, 5.0])  # ties in gold
    cos = torch.rand(3, 8, generator=g)
    cos[1] = torch.tensor([0.1, 0.3, 0.3, 0.2, 0.5, 0.9, 0.8, 0.8])  # ties in predictions
    cos[2] = 0.5
    rho = sts_spearman(cos, gold)
    for layer in range(2):
        assert rho[layer].item() == pytest.approx(spearmanr(cos[layer].numpy(), gold.numpy())[0], abs=1e-5)
    assert math.isnan(rho[2].item())
    assert spearman_columns(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]),
                            torch.tensor([2.0, 1.0, 4.0, 3.0, 5.0])).item() == pytest.approx(0.8, abs=1e-6)


def test_mean_pool_over_valid_tokens():
    h = torch.arange(2 * 2 * 3 * 2, dtype=torch.float32).view(2, 2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    out = mean_pool(h, mask)
    assert out[0, 0].tolist() == [1.0, 2.0]  # mean of [0,1],[2,3]
    assert out[0, 1].tolist() == [9.0, 10.0]  # mean of [8,9],[10,11]
    assert out[1, 0].tolist() == [13.0, 14.0]
    with pytest.raises(ValueError, match="no valid token"):
        mean_pool(h, torch.tensor([[1, 0, 0], [0, 0, 0]]))


def _attention():
    """B=1, H=2, T=3; keys 0 (<s>) and 2 (</s>) special; last query is padding."""
    a = torch.tensor([[[[0.5, 0.2, 0.3], [0.1, 0.8, 0.1], [1.0, 0.0, 0.0]],
                       [[0.0, 1.0, 0.0], [0.25, 0.25, 0.5], [0.0, 0.0, 1.0]]]])
    return a, torch.tensor([[True, False, True]]), torch.tensor([[True, True, False]])


def test_attention_mass_on_hand_built_matrix():
    a, keys, queries = _attention()
    # head 0: queries 0,1 put 0.8 and 0.2 on special keys -> 0.5; head 1: 0.0 and 0.75 -> 0.375
    assert special_token_attention_mass(a, keys, queries).tolist() == pytest.approx([0.5, 0.375])
    # all three queries: head 0 (0.8+0.2+1)/3, head 1 (0+0.75+1)/3
    assert special_token_attention_mass(a, keys).tolist() == pytest.approx([2 / 3, 1.75 / 3])
    layered = torch.stack([a, a.flip(-1)])
    out = special_token_attention_mass(layered, keys, queries)
    assert out.shape == (2, 2) and out[0].tolist() == pytest.approx([0.5, 0.375])
    masks = special_key_masks(torch.tensor([[0, 50, 2]]), bos_token_id=0, eos_token_id=2)
    split = special_token_attention_mass(a, masks, queries)
    assert split["bos"].tolist() == pytest.approx([0.3, 0.125]) and split["eos"].tolist() == pytest.approx([0.2, 0.25])
    acc = AttentionMassAccumulator((2,))
    acc.update(a, keys, queries)
    acc.update(a, keys, torch.tensor([[False, False, True]]))  # adds query 2: head 0 mass 1.0, head 1 1.0
    assert acc.compute().tolist() == pytest.approx([(0.8 + 0.2 + 1) / 3, (0 + 0.75 + 1) / 3])


def test_frequency_spearman_known_rank_correlation():
    freqs = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    vals = torch.stack([
        torch.stack([freqs * 10, -freqs], -1),                                     # rho +1, -1
        torch.stack([torch.tensor([2.0, 1.0, 4.0, 3.0, 5.0]), torch.ones(5)], -1),  # rho 0.8, constant -> NaN
    ])  # [L=2, V=5, n_dims=2]
    rho = token_frequency_spearman(freqs, vals)
    assert rho[0].tolist() == pytest.approx([1.0, -1.0], abs=1e-6)
    assert rho[1, 0].item() == pytest.approx(0.8, abs=1e-6) and math.isnan(rho[1, 1].item())
    g = torch.Generator().manual_seed(1)
    f = torch.randint(1, 5, (40,), generator=g).float()  # many ties, like real counts
    v = torch.randn(3, 40, 2, generator=g)
    rho = token_frequency_spearman(f, v)
    for layer in range(3):
        for j in range(2):
            assert rho[layer, j].item() == pytest.approx(spearmanr(f.numpy(), v[layer, :, j].numpy())[0], abs=1e-5)


def test_token_value_accumulator_means_and_counts():
    acc = TokenValueAccumulator(vocab_size=10, num_layers=2, n_dims=1)
    ids = torch.tensor([3, 3, 7, 3])
    vals = torch.tensor([[1.0, 2.0, 10.0, 6.0], [0.0, 0.0, -1.0, 3.0]]).unsqueeze(-1)
    acc.update(ids[:2], vals[:, :2])
    acc.update(ids[2:], vals[:, 2:])
    seen, counts, means = acc.result()
    assert seen.tolist() == [3, 7] and counts.tolist() == [3, 1]
    assert means[..., 0].tolist() == [[3.0, 10.0], [1.0, -1.0]]
    seen2, _, _ = acc.result(min_count=2)
    assert seen2.tolist() == [3]
    with pytest.raises(ValueError, match="token ids"):
        acc.update(torch.tensor([10]), torch.zeros(2, 1, 1))
