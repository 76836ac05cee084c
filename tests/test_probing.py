"""Probe math (outlierlab.metrics.probe_contributions) and the all-layers linear probes (outlierlab.lightning_modules.probes), Luo et al. 2021."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from outlierlab.metrics.probe_contributions import chance_accuracy, contribution, rank_of_dims, top_dims
from outlierlab.datamodules.features import RowBatches, row_loader
from outlierlab.lightning_modules.probes import PositionProbe, train_probe


def test_contribution_hand_computed_3_dims():
    # W [d=3, M=2]; logits = v @ W, so the true-class weights are the column w_y.
    w = torch.tensor([[1.0, -2.0],
                      [0.5, 3.0],
                      [-4.0, 0.0]])
    v = torch.tensor([[2.0, 1.0, 1.0],     # y=0: |1*2|, |0.5*1|, |-4*1|  = 2, 0.5, 4
                      [1.0, -1.0, 5.0]])   # y=1: |-2*1|, |3*-1|, |0*5|   = 2, 3,   0
    y = torch.tensor([0, 1])
    assert torch.allclose(contribution(w, v, y, reduction="none"), torch.tensor([[2.0, 0.5, 4.0], [2.0, 3.0, 0.0]]))
    assert torch.allclose(contribution(w, v, y), torch.tensor([2.0, 1.75, 2.0]))
    assert torch.allclose(contribution(w, v, y, reduction="sum"), torch.tensor([4.0, 3.5, 4.0]))
    # Batched over layers: layer 1 = 10x weights -> 10x contributions.
    batched = contribution(torch.stack([w, 10 * w]), torch.stack([v, v]), y)
    assert torch.allclose(batched, torch.tensor([[2.0, 1.75, 2.0], [20.0, 17.5, 20.0]]))


def test_contribution_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shapes"):
        contribution(torch.zeros(3, 2), torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))


def test_rank_top_and_chance():
    scores = torch.tensor([0.1, 5.0, 0.0, 0.0, 2.0])
    assert top_dims(scores, 2) == [1, 4]
    assert rank_of_dims(scores, [1, 4, 0, 2, 3]) == [1, 2, 3, 4, 4]  # tied zeros share rank 4
    assert chance_accuracy(torch.tensor([0, 1, 1, 2])) == 0.5


def _synthetic(n_sent=300, length=10, noise_dim=16, seed=0):
    """Layer 0: one-hot(position) ⊕ noise (position is linearly decodable); layer 1: noise only."""
    g = np.random.default_rng(seed)
    pos = np.tile(np.arange(length), n_sent)
    onehot = np.eye(length)[pos] * 5.0
    noise = g.normal(size=(2, len(pos), noise_dim))
    layer0 = np.concatenate([onehot, noise[0]], 1)
    layer1 = np.concatenate([g.normal(size=(len(pos), length)), noise[1]], 1)
    feats = np.stack([layer0, layer1]).astype(np.float16)  # [L=2, N, d] as in the feature cache
    sent = np.repeat(np.arange(n_sent), length)
    return feats, pos, sent


def _fit(feats, pos, sent, layers=None, epochs=3, seed=0):
    split = {"train": sent < 200, "validation": (sent >= 200) & (sent < 250), "test": sent >= 250}
    ds = {s: RowBatches(feats, np.flatnonzero(m), pos[m], layers=layers) for s, m in split.items()}
    n_layers = feats.shape[0] if layers is None else len(layers)
    module = PositionProbe(n_layers, feats.shape[2], num_positions=300, lr=1e-2, layer_ids=layers, seed=seed)
    res = train_probe(module, row_loader(ds["train"], 128, True, seed), row_loader(ds["validation"], 512, False),
                      row_loader(ds["test"], 512, False), epochs=epochs, accelerator="cpu")
    return res, module, ds


def test_position_probe_learns_position_but_not_from_noise():
    feats, pos, sent = _synthetic()
    res, _, _ = _fit(feats, pos, sent)
    chance = 1 / 10  # 10 positions, uniform in every sentence
    assert chance_accuracy(torch.from_numpy(pos)) == pytest.approx(chance)
    assert res["accuracy"][0] > 0.98
    assert res["accuracy"][1] < chance + 0.08


def test_all_layers_together_equals_one_layer_alone():
    feats, pos, sent = _synthetic(seed=1)
    feats = np.concatenate([feats, feats[::-1] * np.float16(0.5)])  # 4 layers, all different
    together, m_all, _ = _fit(feats, pos, sent, epochs=2, seed=3)
    for layer in (1, 2):
        alone, m_one, _ = _fit(feats, pos, sent, layers=[layer], epochs=2, seed=3)
        assert alone["accuracy"][layer] == pytest.approx(together["accuracy"][layer], abs=2e-3)
        assert torch.allclose(m_one.probe.weight[0], m_all.probe.weight[layer], atol=1e-4)


def test_streamed_test_contribution_equals_formula_on_all_test_vectors():
    feats, pos, sent = _synthetic(n_sent=260)
    res, module, ds = _fit(feats, pos, sent, epochs=1)
    test = ds["test"]
    x, y = test[list(range(len(test)))]
    expected = contribution(module.probe.weight.detach(), x, y)
    assert torch.allclose(res["contribution"], expected, rtol=1e-4, atol=1e-6)


def test_per_position_accuracy_separates_edges_from_the_middle():
    """Like a position-free encoder, features that mark only the first and last token (<s>, </s>) let the
    probe find positions 0 and 9 and nothing in between: per-position accuracy shows it."""
    g = np.random.default_rng(0)
    n_sent, length = 300, 10
    pos = np.tile(np.arange(length), n_sent)
    edge = np.stack([pos == 0, pos == length - 1], 1) * 5.0
    feats = np.concatenate([edge, g.normal(size=(len(pos), 8))], 1)[None].astype(np.float16)
    sent = np.repeat(np.arange(n_sent), length)
    res, _, _ = _fit(feats, pos, sent, epochs=3)
    acc, count = res["per_class_accuracy"][0], res["per_class_count"]
    assert count[:length].tolist() == [50.0] * length and count[length:].sum() == 0  # 50 test sentences
    assert acc[0] > 0.98 and acc[length - 1] > 0.98
    assert acc[1:length - 1].mean() < 0.3  # the 8 middle positions: chance is 1/8
    overall = res["accuracy"][0]
    assert overall == pytest.approx(float((acc[:length] * count[:length]).sum() / count.sum()), abs=1e-6)


def test_bias_free_sentence_classifier_is_a_pure_projection():
    """Luo et al. §4.4's W ∈ R^{d×N}: no offset, so the zero vector scores every class 0; with a bias it need not."""
    from outlierlab.lightning_modules.probes import SentenceClassifier

    free = SentenceClassifier(2, 4, 3, bias=False)
    assert free.probe.bias is None and sum(p.numel() for p in free.parameters()) == 2 * 4 * 3
    x = torch.zeros(2, 8, 4)
    assert torch.equal(free(x), torch.zeros(2, 8, 3))
    x[..., 1] = 2.0  # a score is x·W_c exactly
    torch.testing.assert_close(free(x), 2.0 * free.probe.weight[:, 1, None, :].expand(2, 8, 3))
    biased = SentenceClassifier(2, 4, 3)
    with torch.no_grad():
        biased.probe.bias[:, 2] = 1.0
    assert (biased(torch.zeros(2, 8, 4)).argmax(-1) == 2).all()


def test_task_configs_carry_the_papers_batch_sizes():
    from pathlib import Path

    from omegaconf import OmegaConf

    root = Path(__file__).resolve().parent.parent / "configs" / "task"
    sizes = {t: OmegaConf.load(root / f"{t}.yaml").batch_size for t in ("sst2", "sst5", "imdb", "position")}
    assert sizes == {"sst2": 768, "sst5": 1536, "imdb": 128, "position": None}  # Luo et al. §4.4; None: probe's
