"""Order use and attention locality (outlierlab.metrics.word_order): hand-computed cases and the properties that
define them -- a masked LM without positions is permutation-equivariant, so its order use is 0."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from outlierlab.metrics.word_order import (attention_locality, movable_positions, order_use, order_use_message,
                                           permute_block_tokens, pooled_order_change)
from outlierlab.models import EncoderConfig, RobertaMaskedLM

SPECIAL = (0, 1, 2)  # <s>, <pad>, </s>


def test_permutation_keeps_specials_padding_and_pairs():
    ids = torch.tensor([[0, 10, 11, 12, 13, 2, 1, 1], [0, 20, 21, 22, 23, 24, 25, 2]])
    labels = torch.full_like(ids, -100)
    labels[0, 2] = 99  # a predicted position moves with its token
    mask = (ids != 1).long()
    movable = movable_positions(ids, labels, mask, SPECIAL)
    assert movable.tolist()[0] == [False, True, True, True, True, False, False, False]
    out = permute_block_tokens({"input_ids": ids, "labels": labels, "masked_positions": torch.tensor([2])}, movable,
                               torch.Generator().manual_seed(3))
    assert "masked_positions" not in out  # a flat index no longer applies after the shuffle
    new = out["input_ids"]
    assert (new[~movable] == ids[~movable]).all()
    for r in range(2):
        assert sorted(new[r][movable[r]].tolist()) == sorted(ids[r][movable[r]].tolist())
    (where,) = (out["labels"][0] == 99).nonzero(as_tuple=True)
    assert new[0, where].item() == 11  # the label travelled with token 11
    assert not torch.equal(new, ids)


def test_a_labelled_special_token_moves():
    ids = torch.tensor([[0, 5, 2, 6, 2]])
    labels = torch.tensor([[-100, -100, 2, -100, -100]])  # a </s> the loss predicts is not fixed
    assert movable_positions(ids, labels, None, SPECIAL).tolist() == [[False, True, True, True, False]]


def _mlm_loss_sum(model):
    def loss_sum(batch):
        out = model(batch["input_ids"], batch.get("attention_mask"), batch["labels"])
        n = int((batch["labels"] != -100).sum())
        return out.loss * n, n
    return loss_sum


def _random_mlm_batches(n=3, B=4, T=24, V=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(4, V - 1, (B, T), generator=g)
        ids[:, 0] = 0
        mask = torch.ones(B, T, dtype=torch.long)
        mask[1, T - 5:] = 0  # a padded row
        ids[1, T - 5:] = 1
        ids[:, T - 6] = 2
        labels = torch.full_like(ids, -100)
        pick = (torch.rand(B, T, generator=g) < 0.3) & (ids > 3)
        labels[pick] = ids[pick]
        ids = torch.where(pick, torch.full_like(ids, V - 1), ids)
        out.append({"input_ids": ids, "labels": labels, "attention_mask": mask})
    return out


@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_masked_model_without_positions_has_zero_order_use(norm_placement):
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                        max_len=32, pos={"name": "none"}, dropout=0.0, attention_dropout=0.0,
                        norm_placement=norm_placement)
    model = RobertaMaskedLM(cfg).eval()
    res = order_use(_mlm_loss_sum(model), _random_mlm_batches(), SPECIAL, seed=1)
    assert res["loss_permuted"] != 0
    assert abs(res["order_use"]) < 1e-5
    # ... while the same model with learned positions is not equivariant
    cfg.pos = {"name": "learned"}
    torch.manual_seed(0)
    learned = RobertaMaskedLM(cfg).eval()
    with torch.no_grad():
        learned.roberta.embeddings.position_embeddings.weight.normal_(0, 1.0)
    assert abs(order_use(_mlm_loss_sum(learned), _random_mlm_batches(), SPECIAL, seed=1)["order_use"]) > 1e-3


def test_permutations_are_reproducible():
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_len=32,
                        pos={"name": "learned"}, dropout=0.0, attention_dropout=0.0)
    model = RobertaMaskedLM(cfg).eval()
    a = order_use(_mlm_loss_sum(model), _random_mlm_batches(), SPECIAL, seed=5)
    b = order_use(_mlm_loss_sum(model), _random_mlm_batches(), SPECIAL, seed=5)
    assert a == b


def test_a_previous_token_copier_has_a_large_order_use():
    """A hand-built masked "model" that predicts each masked token as its left neighbour, on blocks where that is
    always right: intact loss ~0, permuted loss ~ -log(tiny) -- order use of several nats."""
    V, T = 40, 20
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(2):
        ids = torch.randint(4, V - 1, (8, T), generator=g)
        ids[:, 0] = 0
        labels = torch.full_like(ids, -100)
        pick = torch.zeros_like(ids, dtype=torch.bool)
        pick[:, 2::3] = True
        ids = torch.where(pick, ids.roll(1, dims=1), ids)
        labels[pick] = ids[pick]
        batches.append({"input_ids": torch.where(pick, torch.full_like(ids, V - 1), ids), "labels": labels})

    def copier(batch):
        left = batch["input_ids"].roll(1, dims=1)
        logits = F.one_hot(left, V).float() * 20.0
        keep = batch["labels"] != -100
        return F.cross_entropy(logits[keep], batch["labels"][keep], reduction="sum"), int(keep.sum())

    res = order_use(copier, batches, SPECIAL)
    assert res["loss"] < 1e-6
    assert res["order_use"] > 5.0


def test_causal_model_without_positions_uses_order_once_trained():
    """The causal mask is an order signal (Haviv et al. 2022): trained on blocks where each token determines the
    next, a causal LM without positions loses that when the tokens are permuted; untrained, it is near 0."""
    torch.manual_seed(0)
    V, T = 24, 16
    cfg = EncoderConfig(vocab_size=V, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_len=T,
                        pos={"name": "none"}, dropout=0.0, attention_dropout=0.0, causal=True)
    model = RobertaMaskedLM(cfg)

    def blocks(seed):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(4, V, (16, 1), generator=g)
        ids = 4 + (start - 4 + torch.arange(T)) % (V - 4)  # successor sequences
        ids[:, 0] = 0
        return {"input_ids": ids, "labels": ids.clone()}

    def loss_sum(batch):
        n = int((batch["labels"][:, 1:] != -100).sum())
        return model(batch["input_ids"], None, batch["labels"]).loss * n, n

    before = order_use(loss_sum, [blocks(99)], SPECIAL)["order_use"]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(150):
        loss = model(blocks(step)["input_ids"], None, blocks(step)["labels"]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    after = order_use(loss_sum, [blocks(99)], SPECIAL)
    assert after["loss"] < 0.5
    assert after["order_use"] > 1.0 > abs(before)


def test_pooled_order_change_hand_computed():
    """A "model" whose one layer is each token's one-hot id plus a position code: intact and shuffled texts have
    the same id mean, so the pooled change comes from the position code alone -- computed by hand."""
    def hidden(ids, mask):
        ids_part = F.one_hot(ids, 6).double()
        position = torch.zeros_like(ids_part)
        position[:, :, 0] = (ids == 3) * torch.arange(ids.shape[1]).double()  # token 3 carries its position
        return [ids_part, ids_part + position]

    ids = torch.tensor([[0, 3, 4, 5, 2]])  # <s> 3 4 5 </s>: the movable tokens 3, 4, 5
    mask = torch.ones_like(ids)
    res = pooled_order_change(hidden, [(ids, mask)], SPECIAL, seed=0)
    shuffled = permute_block_tokens({"input_ids": ids}, movable_positions(ids, None, mask, SPECIAL),
                                    torch.Generator().manual_seed(0))["input_ids"]
    where = int((shuffled[0] == 3).nonzero())  # token 3 moved from position 1 to here
    # layer 1 pooled over the movable tokens: one-hots of 3, 4, 5 (1/3 each) plus token 3's position code in slot 0
    a = torch.tensor([1 / 3, 0, 0, 1 / 3, 1 / 3, 1 / 3], dtype=torch.float64)
    b = torch.tensor([where / 3, 0, 0, 1 / 3, 1 / 3, 1 / 3], dtype=torch.float64)
    expected = 1 - float(a @ b / (a.norm() * b.norm()))
    assert res["texts"] == 1 and res["change"][0].item() == 0.0
    assert where != 1 and res["change"][1].item() == pytest.approx(expected, rel=1e-12)


def test_pooled_order_change_is_zero_without_positions_and_not_with_them():
    """An encoder without positions is permutation-equivariant: every layer's mean-pooled vector is the same in any
    order (up to summation order); learned positions move it."""
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_len=32,
                        pos={"name": "none"}, dropout=0.0, attention_dropout=0.0)
    batches = [(b["input_ids"], b["attention_mask"]) for b in _random_mlm_batches()]

    def hidden_of(model):
        return lambda ids, mask: model(ids, mask, output_hidden_states=True).hidden_states

    res = pooled_order_change(hidden_of(RobertaMaskedLM(cfg).eval()), batches, SPECIAL, seed=1)
    assert res["change"].shape == (3,) and res["texts"] == sum(len(b[0]) for b in batches)
    assert res["change"].abs().max().item() < 1e-12
    cfg.pos = {"name": "learned"}
    torch.manual_seed(0)
    learned = RobertaMaskedLM(cfg).eval()  # at init: the embedding LayerNorm already mixes token and position
    change = pooled_order_change(hidden_of(learned), batches, SPECIAL, seed=1)["change"]
    assert (change > 1e-4).all()
    assert pooled_order_change(hidden_of(learned), batches, SPECIAL, seed=1)["change"].equal(change)  # seeded


def test_attention_locality_hand_computed():
    T = 5
    attn = torch.zeros(1, 1, T, T)
    attn[..., 0] = 1.0  # every query attends to key 0 only
    res = attention_locality([attn, torch.full((1, 1, T, T), 1 / T)])
    # key 0 lies within 2 of queries 0, 1, 2: mass 3/5; uniform rows put (3+4+5+4+3)/5/5 = 19/25 in the window
    assert res["mass"][0].item() == pytest.approx(3 / 5)
    assert res["uniform"].item() == pytest.approx(19 / 25)
    assert res["mass"][1].item() == pytest.approx(19 / 25)  # a uniform layer sits on its baseline
    causal = attention_locality([attn], causal=True)
    assert causal["uniform"].item() == pytest.approx((1 + 1 + 1 + 3 / 4 + 3 / 5) / 5)
    padded = attention_locality([attn], attention_mask=torch.tensor([[1, 1, 1, 1, 0]]))
    assert padded["mass"][0].item() == pytest.approx(3 / 4)  # queries 0..3; query 3 is 3 away from key 0
    assert padded["uniform"].item() == pytest.approx((3 / 4 + 1 + 1 + 3 / 4) / 4)
    heads = torch.stack([attn[0, 0], torch.eye(T)])[None]  # a second head attending to itself: mass 1
    assert attention_locality([heads])["mass"][0].item() == pytest.approx((3 / 5 + 1) / 2)


def test_message_below_and_above_threshold():
    assert order_use_message(0.02, 0.1).startswith("the model does not use token order yet: order use 0.020")
    assert order_use_message(0.5, 0.1) is None


def test_train_reports_order_use_below_threshold_only(caplog):
    from outlierlab.jobs.training import report_order_use

    with caplog.at_level(logging.WARNING, logger="outlierlab.jobs.training"):
        assert report_order_use({"val/order_use": 0.01}, 0.1) is not None
        assert report_order_use({"val/order_use": 0.8}, 0.1) is None
        assert report_order_use({"val/loss": 3.0}, 0.1) is None  # not measured: nothing to say
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("the model does not use token order yet")


def test_a_masked_model_without_positions_is_told_it_cannot_use_order_not_yet():
    from outlierlab.jobs.training import report_order_use
    from outlierlab.models import EncoderConfig

    def line(pos: str, causal: bool) -> str:
        return report_order_use({"val/order_use": 0.0}, 0.1, EncoderConfig(pos={"name": pos}, causal=causal))

    assert line("none", False).startswith("the model cannot use token order: a masked LM without positions")
    assert "0 by construction" in line("none", False)
    # a causal model without positions sees order through its mask, and a learned table may still be learned
    assert line("none", True).startswith("the model does not use token order yet")
    assert line("learned", False).startswith("the model does not use token order yet")


def test_study_flags_cells_below_the_threshold_at_their_last_step():
    import pandas as pd

    from outlierlab.studies.aggregate import order_use_flags

    rows = [("pos=learned", 1, 1000, 0.01), ("pos=learned", 1, 2000, 3.0),  # left the plateau: not flagged
            ("pos=learned", 2, 1000, 0.5), ("pos=learned", 2, 2000, 0.02),  # below at its last step: flagged
            ("pos=none", 1, 2000, 0.0)]
    per_seed = pd.DataFrame([{"group": g, "seed": s, "step": st, "layer": "model", "metric": "val/order_use",
                              "value": v} for g, s, st, v in rows]
                            + [{"group": "pos=rope", "seed": 1, "step": 2000, "layer": "model", "metric": "val/loss",
                                "value": 3.0}])
    flags = order_use_flags(per_seed, 0.1)
    assert flags[:2] == ["pos=learned, seed 2: order use 0.020 nats at step 2000",
                         "pos=none, seed 1: order use 0.000 nats at step 2000"]
    assert flags[2] == "order use not measured: pos=rope, seed 1"
    assert order_use_flags(per_seed[per_seed["metric"] == "val/loss"]) == []  # nothing measured: nothing to say
    # a masked LM without positions cannot use order: its line says so (the group is judged from the cells' configs)
    flags = order_use_flags(per_seed, 0.1, orderless={"pos=none"})
    assert flags[1] == ("pos=none, seed 1: order use 0.000 nats at step 2000 (cannot: a masked LM without positions, "
                        "0 by construction)")


def test_orderless_groups_are_masked_models_without_positions_only():
    from types import SimpleNamespace

    from outlierlab.studies.aggregate import orderless_groups

    def cell(pos: str, causal: bool):
        return SimpleNamespace(config={"model.pos.name": pos, "model.causal": causal})

    groups = {"mlm none": [cell("none", False)] * 2, "clm none": [cell("none", True)], "mlm learned": [cell("learned", False)],
              "mixed": [cell("none", False), cell("rope", False)], "empty": []}
    assert orderless_groups(groups) == {"mlm none"}


def test_held_out_masking_and_a_transformers_model():
    """masked_for_order_use draws a fixed problem; lm_loss_sum calls any HF-style LM: a RobertaForMaskedLM with its
    position table zeroed is a bag-of-words model (order use 0), with a random table it is not."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    from outlierlab.metrics.word_order import lm_loss_sum, masked_for_order_use

    ids = torch.randint(4, 40, (6, 12), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = 0, 2
    mask = torch.ones_like(ids)
    mask[2, 8:] = 0
    ids[2, 8:] = 1
    special = (ids <= 2).long()
    a = masked_for_order_use(ids, mask, special, mask_id=49, seed=3)
    b = masked_for_order_use(ids, mask, special, mask_id=49, seed=3)
    assert torch.equal(a["input_ids"], b["input_ids"])
    picked = a["labels"] != -100
    assert picked.any(dim=1).all() and not (picked & (special.bool() | ~mask.bool())).any()
    assert (a["input_ids"][picked] == 49).all() and torch.equal(a["labels"][picked], ids[picked])

    torch.manual_seed(0)
    hf = RobertaForMaskedLM(RobertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, max_position_embeddings=20, type_vocab_size=1,
                                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    with torch.no_grad():
        hf.roberta.embeddings.position_embeddings.weight.normal_(0, 1.0)
    assert abs(order_use(lm_loss_sum(hf, False), [a], SPECIAL)["order_use"]) > 1e-3
    with torch.no_grad():
        hf.roberta.embeddings.position_embeddings.weight.zero_()
    assert abs(order_use(lm_loss_sum(hf, False), [a], SPECIAL)["order_use"]) < 1e-5


def test_labelled_rows_only_equal_the_full_head_of_a_transformers_mlm_and_ours():
    """labelled_loss_sum projects only the labelled rows onto the vocabulary (a pre-hook on the output embedding):
    the same summed loss and count as the full head's mean x count, on a Hugging Face RoBERTa and BERT; the hook is
    gone afterwards (the full logits come back); our own model (no output-embedding Linear) takes lm_loss_sum."""
    from transformers import BertConfig, BertForMaskedLM, RobertaConfig, RobertaForMaskedLM

    from outlierlab.metrics.word_order import labelled_loss_sum, lm_loss_sum, masked_for_order_use

    ids = torch.randint(4, 40, (5, 12), generator=torch.Generator().manual_seed(1))
    ids[:, 0], ids[:, -1] = 0, 2
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    batch = masked_for_order_use(ids, mask, (ids <= 2).long(), mask_id=49, seed=2)
    torch.manual_seed(0)
    small = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=20)
    for model in (RobertaForMaskedLM(RobertaConfig(**small)).eval(), BertForMaskedLM(BertConfig(**small)).eval()):
        seen = []
        spy = model.get_output_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
        with torch.no_grad():
            fast, n_fast = labelled_loss_sum(model)(batch)
            spy.remove()
            full, n_full = lm_loss_sum(model, False)(batch)
            assert seen == [n_fast]  # the vocabulary projection saw the labelled rows only
            assert n_fast == n_full == int((batch["labels"] != -100).sum()) > 0
            torch.testing.assert_close(fast, full, rtol=1e-5, atol=1e-5)
            assert model(input_ids=ids, attention_mask=mask).logits.shape == (5, 12, 50)  # the hook was removed
    ours = RobertaMaskedLM(EncoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=2,
                                         intermediate_size=64, max_len=16))
    with torch.no_grad():
        assert labelled_loss_sum(ours.eval())(batch)[1] == n_full
