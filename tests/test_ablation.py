"""BERT Busters ablation (outlierlab.evaluation.analyses.ablation, outlierlab.datamodules.scoring_batches, outlierlab.metrics.scored_rows, outlierlab.models.layernorms): weight surgery, masking,
scoring, run()."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ablation_fixtures import PLANTED_DIM, make_ctx, save_planted, tiny_mlm
from probe_fixtures import SENTENCES, byte_level_tokenizer, save_tiny_bert

ROOT = Path(__file__).resolve().parent.parent


def _loaded(model, tok):
    from outlierlab.models.lm_model import LoadedModel, layernorm_map

    return LoadedModel(model, tok, layernorm_map(model), "outlierlab", "tiny", True, max_length=64)


# ------------------------------------------------------------------------------------------ weight surgery
@pytest.mark.parametrize("kinds", [["output"], ["output", "attention_output", "embeddings"]])
def test_zeroing_touches_exactly_the_chosen_entries_and_restores(kinds):
    from outlierlab.models.layernorms import select_layernorms, zero_layernorm_dims

    model, _ = tiny_mlm(plant=False)
    chosen = select_layernorms(model.named_layernorms(), kinds)
    expect_n = {1: 3, 3: 7}[len(kinds)]
    assert len(chosen) == expect_n
    touched = {f"{n}.{p}" for n, m in model.named_modules() if any(m is ln for ln in chosen.values())
               for p in ("weight", "bias")}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dims = [0, 5, 31]
    with zero_layernorm_dims(chosen, dims):
        now = model.state_dict()
        for k, v in now.items():
            if k in touched:
                assert torch.all(v[dims] == 0), k
                keep = [i for i in range(v.shape[0]) if i not in dims]
                assert torch.equal(v[keep], before[k][keep]), k
            else:
                assert torch.equal(v, before[k]), f"{k} changed but is not a chosen LayerNorm"
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # restored also when the body raises
    with pytest.raises(RuntimeError):
        with zero_layernorm_dims(chosen, dims):
            raise RuntimeError("boom")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_layernorm_selection_and_bad_input():
    from outlierlab.models.layernorms import select_layernorms, zero_layernorm_dims

    model, _ = tiny_mlm(plant=False)
    lns = model.named_layernorms()
    assert list(select_layernorms(lns, ["attention_output"])) == [f"layer.{i}.attention_output" for i in range(3)]
    with pytest.raises(ValueError, match="unknown LayerNorm kind"):
        select_layernorms(lns, ["ouput"])
    with pytest.raises(ValueError, match="out of range"):
        with zero_layernorm_dims(select_layernorms(lns, ["output"]), [32]):
            pass


def test_layernorms_of_layers_are_numbered_as_the_hidden_states():
    from outlierlab.models.layernorms import layernorms_of_layers, select_layernorms

    model, _ = tiny_mlm(plant=False)
    lns = model.named_layernorms()
    outputs = select_layernorms(lns, ["output"])
    # layer i + 1 is block i's output (outliers.csv numbering); 0 is the embeddings' norm
    assert list(layernorms_of_layers(outputs, [1])) == ["layer.0.output"]
    assert list(layernorms_of_layers(outputs, [3, 2])) == ["layer.1.output", "layer.2.output"]
    both = select_layernorms(lns, ["output", "embeddings"])
    assert list(layernorms_of_layers(both, [0, 1])) == ["embeddings", "layer.0.output"]
    with pytest.raises(ValueError, match=r"^layers \[4\]: .* are in layers 1, 2, 3 \(0 = embeddings"):
        layernorms_of_layers(outputs, [1, 4])
    with pytest.raises(ValueError, match=r"^layers \[0\]:"):  # the embeddings' norm was not chosen
        layernorms_of_layers(outputs, [0])


def test_planted_dim_is_the_detected_outlier():
    from outlierlab.metrics.layernorm_rule import LayerNormRule, layernorm_outliers
    from outlierlab.models.layernorms import layernorm_tensors, model_layernorms

    model, _ = tiny_mlm()
    det = layernorm_outliers(layernorm_tensors(model_layernorms(model)))
    # 3 layers: "4/12" rounds up to 1 layer; dim 7 is planted in the output LN of all three
    assert det.dims == [PLANTED_DIM] and det.counts == {PLANTED_DIM: 3} and det.min_layers == 1
    # attention-output LayerNorms carry no planted dim: nothing flagged in >= 2 of them
    rule = LayerNormRule(layernorms=["attention_output"], criterion="either", min_layers=2)
    assert layernorm_outliers(layernorm_tensors(model_layernorms(model)), rule).dims == []


# ------------------------------------------------------------------------------------------ masking, scoring
def test_evaluation_masking_is_deterministic_mask_only_and_skips_specials():
    from outlierlab.datamodules.scoring_batches import masked_batches

    tok = byte_level_tokenizer()
    texts = SENTENCES * 10
    a = masked_batches(tok, texts, max_length=64, batch_size=16, mlm_probability=0.15, seed=3)
    b = masked_batches(tok, texts, max_length=64, batch_size=16, mlm_probability=0.15, seed=3)
    c = masked_batches(tok, texts, max_length=64, batch_size=16, mlm_probability=0.15, seed=4)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
    assert not all(torch.equal(x["labels"], y["labels"]) for x, y in zip(a, c))
    orig = tok(texts)["input_ids"]
    n_sel = n_tok = 0
    for bi, batch in enumerate(a):
        sel = batch["labels"] != -100
        assert torch.all(batch["input_ids"][sel] == tok.mask_token_id)  # no 80/10/10 at evaluation
        for r in range(batch["input_ids"].shape[0]):
            ids = orig[bi * 16 + r]
            row_sel = sel[r, :len(ids)]
            assert not row_sel[0] and not row_sel[len(ids) - 1]  # <s>, </s> never masked
            assert not sel[r, len(ids):].any()  # nor padding
            assert torch.equal(batch["labels"][r, :len(ids)][row_sel], torch.tensor(ids)[row_sel])
            n_sel += int(row_sel.sum())
            n_tok += len(ids) - 2
    assert 0.10 < n_sel / n_tok < 0.20


def test_mlm_scores_hand_computed():
    from outlierlab.metrics.scored_rows import mlm_scores

    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    labels = torch.tensor([[0, -100, 2]])
    batch = {"input_ids": torch.zeros(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3), "labels": labels}
    s = mlm_scores(lambda ids, mask, rows: logits, [batch])
    l0 = -math.log(math.exp(2) / (math.exp(2) + 2))  # correct (argmax 0)
    l2 = -math.log(1 / (math.exp(1) + 2))  # wrong (argmax 1)
    assert s["n_masked"] == 2 and s["top1"] == 0.5
    assert s["loss"] == pytest.approx((l0 + l2) / 2, rel=1e-6)
    assert s["ppl"] == pytest.approx(math.exp((l0 + l2) / 2), rel=1e-6)


def test_mlm_scores_by_position_hand_computed():
    """Each scored token in the bucket of its position (1, 2-3, 4-7): real tokens counted, so under left padding
    column 3 is position 1; the buckets add up to the whole."""
    from outlierlab.metrics.scored_rows import mlm_scores

    logits = torch.zeros(2, 6, 3)
    logits[0, 1, 0], logits[0, 5, 1], logits[1, 3, 0] = 2.0, 3.0, 1.0
    labels = torch.full((2, 6), -100)
    labels[0, 1], labels[0, 2], labels[0, 5], labels[1, 3] = 0, 1, 0, 2
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    batch = {"input_ids": torch.zeros(2, 6, dtype=torch.long), "attention_mask": mask, "labels": labels}
    s = mlm_scores(lambda ids, m, rows: logits, [batch], by_position=True)
    row0_1 = -math.log(math.exp(2) / (math.exp(2) + 2))  # position 1, right (argmax 0)
    row1_3 = -math.log(1 / (math.exp(1) + 2))  # column 3 of a row with two pads: position 1, wrong
    row0_2 = math.log(3)  # position 2: all logits equal, argmax 0 != 1: wrong
    row0_5 = -math.log(1 / (math.exp(3) + 2))  # position 5, wrong
    assert list(s["by_position"]) == [1, 2, 3]  # buckets 1, 2-3, 4-7; none scored at 0
    assert s["by_position"][1] == {"loss": pytest.approx((row0_1 + row1_3) / 2), "top1": 0.5, "n_masked": 2}
    assert s["by_position"][2] == {"loss": pytest.approx(row0_2), "top1": 0.0, "n_masked": 1}
    assert s["by_position"][3] == {"loss": pytest.approx(row0_5), "top1": 0.0, "n_masked": 1}
    assert s["loss"] == pytest.approx((row0_1 + row1_3 + row0_2 + row0_5) / 4) and s["n_masked"] == 4
    assert "by_position" not in mlm_scores(lambda ids, m, rows: logits, [batch])


def test_random_draws_avoid_outliers_and_follow_the_seed():
    from outlierlab.evaluation.analyses.ablation import run_ablation
    from outlierlab.datamodules.scoring_batches import masked_batches

    model, tok = tiny_mlm(layers=1, plant=False)
    loaded = _loaded(model, tok)
    batches = masked_batches(tok, SENTENCES, 64, 8, 0.3, 0)
    outliers = list(range(0, 20, 2))  # 10 of 32 dims: an unconstrained draw of 10 avoids them with p ~ 0.01

    def draws(seed):
        rows = run_ablation(loaded, batches, ["output"], outliers, [], n_random=8, seed=seed, top_k=5).rows
        return [r["dims"] for r in rows if r["condition"] == "random_draw"]

    d1, d2, d3 = draws(11), draws(11), draws(12)
    assert len(d1) == 8 and d1 == d2 and d1 != d3
    for ds in d1 + d3:
        dims = [int(x) for x in ds.split(";")]
        assert len(dims) == 10 and not set(dims) & set(outliers)
    # the user's dims are under study too: no draw holds one (31 is the only dim neither names)
    rows = run_ablation(loaded, batches, ["output"], [0], list(range(1, 31)), n_random=4, seed=11, top_k=5).rows
    assert [r["dims"] for r in rows if r["condition"] == "random_draw"] == ["31"] * 4


# ---------------------------------------------------------------------------------------------- run()
def test_run_ablation_planted_outlier_rows(tmp_path):
    from outlierlab.models.loading import FrozenEncoder
    from outlierlab.evaluation.analyses.ablation import run

    enc = FrozenEncoder(str(save_planted(tmp_path / "model")), device="cpu")
    ctx = make_ctx("ablation", enc, tmp_path, {"n_random": 3, "dims": [3], "max_length": 64, "batch_size": 8,
                                               "example": "the quick brown {mask} jumps"})
    before = {k: v.clone() for k, v in enc.model.state_dict().items()}
    res = run(ctx)
    conds = [r["condition"] for r in res.rows]
    assert conds == ["intact", "outliers", "random", "random_draw", "random_draw", "random_draw", "user"]
    by = {r["condition"]: r for r in res.rows}
    assert by["outliers"]["dims"] == str(PLANTED_DIM) and res.summary["outlier_dims"] == [PLANTED_DIM]
    assert by["user"]["dims"] == "3" and by["random"]["n_draws"] == 3
    assert len({r["n_masked"] for r in res.rows}) == 1 and by["intact"]["n_masked"] > 20
    # the planted outlier carries the model; one random dim does (almost) nothing (Kovaleva et al.)
    gap_out = abs(by["outliers"]["loss"] - by["intact"]["loss"])
    assert gap_out > 0.2
    assert abs(by["random"]["loss"] - by["intact"]["loss"]) < 0.25 * gap_out
    assert by["intact"]["ppl"] == pytest.approx(math.exp(by["intact"]["loss"]))
    assert all(str(PLANTED_DIM) not in r["dims"].split(";") for r in res.rows if r["condition"] == "random_draw")
    assert "| outlier dims disabled | 1 | 7 |" in res.markdown and "Fill in the blank" in res.markdown
    # by position: every condition's buckets add up to its row, and random is the mean of its draws per bucket
    pos, columns = res.tables["ablation_by_position"]
    assert list(pos[0]) == columns
    for row in (r for r in res.rows if r["condition"] != "random"):
        mine = [p for p in pos if p["condition"] == row["condition"] and p["draw"] == row["draw"]]
        assert sum(p["n_masked"] for p in mine) == row["n_masked"]
        assert sum(p["loss"] * p["n_masked"] for p in mine) / row["n_masked"] == pytest.approx(row["loss"])
    for mean in (p for p in pos if p["condition"] == "random"):
        draws = [p["loss"] for p in pos if p["condition"] == "random_draw" and p["positions"] == mean["positions"]]
        assert len(draws) == 3 and mean["loss"] == pytest.approx(sum(draws) / 3)
    assert "By the position of the scored token" in res.markdown
    assert all(torch.equal(v, before[k]) for k, v in enc.model.state_dict().items())


def test_ablation_layers_zero_only_there(tmp_path):
    from outlierlab.models.loading import FrozenEncoder
    from outlierlab.evaluation.analyses.ablation import run

    enc = FrozenEncoder(str(save_planted(tmp_path / "model")), device="cpu")
    settings = {"n_random": 2, "max_length": 64, "batch_size": 8, "example": None}

    def outliers(layers):
        res = run(make_ctx("ablation", enc, tmp_path, {**settings, "layers": layers}))
        by = {r["condition"]: r for r in res.rows}
        return by["intact"]["loss"], by["outliers"], res.markdown

    intact, everywhere, _ = outliers(None)
    intact_all, listed, _ = outliers([1, 2, 3])  # every layer named: the same norms, the same scores
    intact_2, second, markdown = outliers([2])
    assert everywhere["layers"] == "" and listed["layers"] == "1;2;3" and second["layers"] == "2"
    assert intact == intact_all == intact_2
    assert listed["loss"] == pytest.approx(everywhere["loss"], abs=1e-6)
    # the planted dim zeroed in one of the three output LayerNorms: it is restored by the two after it, so the
    # model loses less than with it gone from all three
    assert intact < second["loss"] < everywhere["loss"] - 0.05
    assert "in layer(s) 2 (1 LayerNorms)" in markdown
    with pytest.raises(ValueError, match=r"^layers \[5\]: "):
        outliers([5])


def save_hf_roberta_mlm(directory: Path) -> Path:
    """A Hugging Face RobertaForMaskedLM (random weights, its head included) and its tokenizer."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(0)
    tok = byte_level_tokenizer()
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=66, type_vocab_size=1)
    RobertaForMaskedLM(cfg).eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def test_hf_mlm_loading_maps_layernorms_and_scores_like_hf(tmp_path):
    from outlierlab.metrics.scored_rows import mlm_scores
    from outlierlab.datamodules.scoring_batches import masked_batches
    from outlierlab.models.lm_model import load_mlm

    tok = byte_level_tokenizer()
    loaded = load_mlm(str(save_hf_roberta_mlm(tmp_path / "hfmlm")))
    m = loaded.model
    assert loaded.has_mlm_head and loaded.kind == "hf"
    assert list(loaded.layernorms) == ["embeddings", "layer.0.attention_output", "layer.0.output",
                                       "layer.1.attention_output", "layer.1.output", "head"]
    assert loaded.layernorms["head"] is m.lm_head.layer_norm
    assert loaded.layernorms["layer.1.output"] is m.roberta.encoder.layer[1].output.LayerNorm
    assert loaded.layernorms["layer.0.attention_output"] is m.roberta.encoder.layer[0].attention.output.LayerNorm
    [batch] = masked_batches(tok, SENTENCES, 64, 64, 0.3, 0)
    ours = mlm_scores(lambda i, a, rows: loaded.forward(i, a, rows=rows).logits, [batch])
    with torch.no_grad():
        ref = m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
    assert ours["loss"] == pytest.approx(float(ref), rel=1e-5)


def test_encoder_without_mlm_head_is_skipped_with_a_note(tmp_path):
    from outlierlab.models.loading import FrozenEncoder
    from outlierlab.evaluation.analyses.ablation import run

    enc = FrozenEncoder(str(save_tiny_bert(tmp_path / "bert")), device="cpu")
    res = run(make_ctx("ablation", enc, tmp_path, {}))
    assert res.rows == [] and "Skipped" in res.markdown and "no masked-LM head" in res.markdown
    assert "skipped" in res.summary


def test_bad_settings_fail_before_any_model_is_loaded(tmp_path):
    from outlierlab.evaluation.analyses.ablation import check

    with pytest.raises(ValueError, match="ablation.layernorms"):
        check(make_ctx("ablation", None, tmp_path, {"layernorms": ["ouput"]}))
    with pytest.raises(ValueError, match="placeholder"):
        check(make_ctx("ablation", None, tmp_path, {"example": "no blank here"}))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        check(make_ctx("ablation", None, tmp_path, {"files": [str(tmp_path / "missing.txt")]}))


@pytest.fixture
def count_loads(monkeypatch):
    """Names of the model classes whose weights ``from_pretrained`` loads, in order."""
    from transformers import PreTrainedModel

    calls, load = [], PreTrainedModel.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        calls.append(cls.__name__)
        return load(cls, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(counted))
    return calls


def test_a_hub_model_is_loaded_once_for_the_sentence_pass_and_the_ablation(tmp_path, count_loads):
    """evaluate with outliers (the encoder's body) then ablation (its LM head): one load, with the head."""
    import outlierlab as ol
    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder(str(save_hf_roberta_mlm(tmp_path / "hfmlm")), device="cpu")
    tables = ol.evaluate(enc, SENTENCES * 6, analyses=["outliers", "ablation"], transforms=["none"],
                         out_dir=tmp_path / "run", progress=False, overrides=["ablation.n_random=1"])
    assert count_loads == ["RobertaForMaskedLM"]
    assert "intact" in set(tables["ablation"]["condition"]) and len(tables["outliers"]) > 0
    assert enc.model is enc.lm_model()[0].roberta and count_loads == ["RobertaForMaskedLM"]


def test_an_encoder_loaded_without_its_head_is_replaced_not_duplicated(tmp_path, count_loads):
    """A bare AutoModel loaded before the head was asked for: the one unavoidable second load, after which
    the encoder runs the head model's body (same hidden states) and the MLM analyses switch to eager attention
    only for their own forwards."""
    from outlierlab.models.lm_model import load_mlm
    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder(str(save_hf_roberta_mlm(tmp_path / "hfmlm")), device="cpu")
    [before] = list(enc.encode(SENTENCES))
    loaded = load_mlm(enc)
    assert count_loads == ["RobertaModel", "RobertaForMaskedLM"]
    assert enc.model is loaded.model.roberta and loaded.has_mlm_head
    [after] = list(enc.encode(SENTENCES))
    assert torch.equal(before.hidden, after.hidden)
    ids = torch.tensor([[0, 5, 6, 2]])
    out = loaded.forward(ids, torch.ones_like(ids), output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (1, 2, 4, 4)
    assert enc.model.config._attn_implementation == "sdpa"  # the encoder's own forwards keep SDPA
    load_mlm(enc)
    assert len(count_loads) == 2
