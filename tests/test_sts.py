"""STS (outlierlab/evaluation/analyses/sts.py): encode each distinct text once, per data set / sub-set rows and their mean
(SentEval), and the whitening guard on the pairs' own sentence vectors.

The encoder is a real FrozenEncoder (tiny BERT directory, MiniLM tokenizer, real batching and padding) whose
forward pass is a per-token lookup, so a text's vectors do not depend on its batch and "encode every
occurrence" can be compared exactly with "encode each distinct text once".
"""

from __future__ import annotations

import csv
import random

import pytest
import torch

from outlierlab.metrics.similarity import pairwise_cosine
from outlierlab.metrics.sts_scores import sts_spearman
from outlierlab.metrics.whitening import DegenerateWhiteningError
from sentence_pass_oracle import padded_batches
from outlierlab.evaluation.registry import EvalContext

D, N_LAYERS = 32, 2
WORDS = "the dog cat saw ran house river bank sea ship captain anne walked green old new".split()


class Counting:
    """Wraps the fake forward and counts the texts (rows) it encodes."""

    def __init__(self, vocab: int):
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(N_LAYERS + 1, vocab, D, generator=g)
        self.pos = 0.3 * torch.randn(N_LAYERS + 1, 128, D, generator=g)
        self.rows = 0

    def __call__(self, input_ids, attention_mask):
        self.rows += input_ids.shape[0]
        return self.table[:, input_ids] + self.pos[:, None, :input_ids.shape[1]]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from outlierlab.models.loading import FrozenEncoder
    from probe_fixtures import save_tiny_bert

    enc = FrozenEncoder(str(save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), layers=N_LAYERS, hidden=D)),
                        batch_size=4)
    enc.forward = Counting(len(enc.tokenizer))
    # sentence_vectors takes the layers one at a time: the same fake states, counted the same way
    enc.forward_layers = lambda ids, attn, fn: [fn(i, h) for i, h in enumerate(enc.forward(ids, attn))]
    return enc


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(n)]


def _write(path, texts: list[str], n_pairs: int, seed: int, genres: list[str] | None = None):
    """All-pairs style file: ``n_pairs`` pairs drawn from ``texts`` (so texts repeat), random gold scores."""
    rng = random.Random(seed)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sentence1", "sentence2", "score"] + (["genre"] if genres else []))
        for i in range(n_pairs):
            a, b = rng.sample(texts, 2)
            w.writerow([a, b, round(rng.uniform(0, 5), 2)] + ([genres[i % len(genres)]] if genres else []))
    return path


def _ctx(compose_cfg, encoder, tmp_path, files, transforms=("none",), extra=()):
    cfg = compose_cfg("evaluate", [f"sts.files=[{','.join(map(str, files))}]", "progress=false",
                                   f"transform=[{','.join(transforms)}]", *extra])
    return EvalContext(encoder, cfg.sts, cfg, list(transforms), tmp_path)


def test_repeated_sentences_are_encoded_once_and_give_exactly_the_same_spearman(encoder, compose_cfg, tmp_path):
    from outlierlab.datamodules.pair_sets import load_sts_pairs
    from outlierlab.evaluation.analyses.sts import run

    texts = _texts(12, seed=1)
    f = _write(tmp_path / "pairs.csv", texts, 60, seed=2)
    pairs = load_sts_pairs([str(f)], "test")
    occurrences = pairs.s1 + pairs.s2
    distinct = len(set(occurrences))
    assert distinct <= 12 < len(occurrences) == 120
    # reference: every occurrence encoded (what the code did before), mean-pooled the same way
    encoder.forward.rows = 0
    ref = torch.zeros(N_LAYERS + 1, len(occurrences), D)
    for b in padded_batches(encoder, occurrences, 4):
        w = b.valid.float()
        ref[:, b.rows] = torch.einsum("lbtd,bt->lbd", b.hidden, w) / w.sum(1)[None, :, None]
    assert encoder.forward.rows == 120
    ref_rho = sts_spearman(pairwise_cosine(ref[:, :60], ref[:, 60:]), pairs.gold)

    encoder.forward.rows = 0
    res = run(_ctx(compose_cfg, encoder, tmp_path, [f]))
    assert encoder.forward.rows == distinct  # each distinct text once
    got = [r["spearman"] for r in res.rows if r["dataset"] == "pairs.csv" and r["subset"] == "all"]
    assert torch.equal(torch.tensor(got, dtype=torch.float64), ref_rho)
    assert f"STS pairs.csv: encoded {distinct} texts for 120 occurrences" in res.markdown


def test_two_files_give_one_row_each_and_a_mean_equal_to_their_average(encoder, compose_cfg, tmp_path):
    from outlierlab.evaluation.analyses.sts import run

    a = _write(tmp_path / "a.csv", _texts(20, seed=3), 40, seed=4)
    b = _write(tmp_path / "b.tsv.csv", _texts(20, seed=5), 35, seed=6)
    both = run(_ctx(compose_cfg, encoder, tmp_path, [a, b]))
    alone = run(_ctx(compose_cfg, encoder, tmp_path, [a]))
    by = {}
    for r in both.rows:
        by.setdefault((r["dataset"], r["subset"]), []).append(r["spearman"])
    assert set(by) == {("a.csv", "all"), ("b.tsv.csv", "all"), ("mean", "headline")}
    ra, rb, mean = (torch.tensor(by[k]) for k in (("a.csv", "all"), ("b.tsv.csv", "all"), ("mean", "headline")))
    assert torch.allclose(mean, (ra + rb) / 2, atol=1e-12) and not torch.allclose(ra, rb)
    # a data set's numbers do not depend on the other file being there
    assert [r["spearman"] for r in alone.rows if r["dataset"] == "a.csv"] == by[("a.csv", "all")]
    assert {r["n_pairs"] for r in both.rows if r["dataset"] == "a.csv"} == {40}
    # the report has one table row per data set and the mean, with the best layer of each
    table = [line for line in both.markdown.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table[1:]] == ["a.csv", "b.tsv.csv", "**mean**"]
    best = int(torch.tensor(by[("a.csv", "all")]).argmax())
    assert f"(L{best})" in table[1]


def test_each_file_whitens_on_its_own_pairs_also_after_another_file(encoder, compose_cfg, tmp_path):
    """The second data set's maps are fitted on its own pairs with the run's transform settings, exactly as if it
    were evaluated alone (the first file's scoring must leave those settings as they were)."""
    from outlierlab.evaluation.analyses.sts import run

    a = _write(tmp_path / "a.csv", _texts(60, seed=3), 80, seed=4)
    b = _write(tmp_path / "b.csv", _texts(60, seed=5), 80, seed=6)
    extra = ["transform.fit_on=eval", "transform.allow_degenerate=true"]
    both = run(_ctx(compose_cfg, encoder, tmp_path, [a, b], ("none", "whiten"), extra))
    alone = run(_ctx(compose_cfg, encoder, tmp_path, [b], ("none", "whiten"), extra))
    second = [r for r in both.rows if r["dataset"] == "b.csv"]
    assert {r["transform"] for r in second} == {"none", "whiten"}
    assert second == [r for r in alone.rows if r["dataset"] == "b.csv"]


def test_sub_sets_are_scored_separately_and_averaged_as_senteval(encoder, compose_cfg, tmp_path):
    from outlierlab.evaluation.analyses.sts import run

    f = _write(tmp_path / "genres.csv", _texts(30, seed=7), 60, seed=8, genres=["news", "forum"])
    res = run(_ctx(compose_cfg, encoder, tmp_path, [f]))
    rows = {}
    for r in res.rows:
        rows.setdefault((r["dataset"], r["subset"]), []).append(r)
    assert set(rows) == {("genres.csv", s) for s in ("all", "forum", "news", "mean")} | {("mean", "headline")}
    assert {r["n_pairs"] for r in rows[("genres.csv", "news")]} == {30}
    news, forum, mean = (torch.tensor([r["spearman"] for r in rows[("genres.csv", s)]])
                         for s in ("news", "forum", "mean"))
    assert torch.allclose(mean, (news + forum) / 2)
    # the across-data-set mean uses the sub-set mean as this data set's headline (SentEval's STS12-16)
    assert torch.allclose(torch.tensor([r["spearman"] for r in rows[("mean", "headline")]]), mean)


def test_whitening_on_too_few_distinct_texts_fails_before_encoding(encoder, compose_cfg, tmp_path):
    from outlierlab.evaluation.analyses.sts import check, run

    f = _write(tmp_path / "docs.csv", _texts(10, seed=9), 45, seed=10)  # <= 10 distinct texts, 32 dims
    ctx = _ctx(compose_cfg, encoder, tmp_path, [f], ("none", "whiten"))
    encoder.forward.rows = 0
    with pytest.raises(DegenerateWhiteningError, match=r"docs\.csv.*distinct texts < 2 x k=32.*transform\.k="):
        check(ctx)
    assert encoder.forward.rows == 0
    # the option keeps the result, marked degenerate in every whitened row
    ctx = _ctx(compose_cfg, encoder, tmp_path, [f], ("none", "whiten"), ["transform.allow_degenerate=true"])
    res = run(ctx)
    white = [r for r in res.rows if r["transform"] == "whiten" and r["dataset"] == "docs.csv"]
    assert white and all(r["whiten_degenerate"] is True and r["whiten_k"] == 32 for r in white)
    assert all(r["whiten_rank"] <= 9 and r["whiten_n"] == 90 for r in white)
    assert "DEGENERATE" in res.markdown
    assert all("whiten_fit" not in r for r in res.rows if r["transform"] == "none")
    # k below the distinct count / 2 is a valid fit: not marked
    ctx = _ctx(compose_cfg, encoder, tmp_path, [f], ("none", "whiten"), ["transform.k=4"])
    check(ctx)
    res = run(ctx)
    assert all(r["whiten_degenerate"] is False for r in res.rows if r["transform"] == "whiten"
               and r["dataset"] == "docs.csv")


def test_standardize_abtt_center_are_fitted_on_the_pairs_and_guarded_like_whitening(encoder, compose_cfg, tmp_path):
    """The other fitted transforms go through the same STS path (fit on the evaluated sentence vectors,
    same pre-encoding refusal, their own ``<name>_*`` fit columns)."""
    from outlierlab.evaluation.analyses.sts import check, run

    few = _write(tmp_path / "few.csv", _texts(4, seed=11), 6, seed=12)  # 4 distinct texts: abtt D=8 needs 18
    with pytest.raises(DegenerateWhiteningError, match=r"abtt fit .*few\.csv.*distinct texts < 2 x D\+1="):
        check(_ctx(compose_cfg, encoder, tmp_path, [few], ("none", "abtt"), ["transform.abtt_d=8"]))
    f = _write(tmp_path / "many.csv", _texts(40, seed=13), 80, seed=14)
    names = ("none", "standardize", "abtt", "center")
    ctx = _ctx(compose_cfg, encoder, tmp_path, [f], names, ["transform.abtt_d=2"])
    check(ctx)
    res = run(ctx)
    by = {t: [r for r in res.rows if r["transform"] == t and r["subset"] == "all"] for t in names}
    assert all(len(v) == N_LAYERS + 1 for v in by.values())
    assert all(r["abtt_d"] == 2 and r["abtt_degenerate"] is False for r in by["abtt"])
    assert all(r["standardize_n"] > 0 and "center_fit" not in r for r in by["standardize"])
    assert all(-1.0 <= r["spearman"] <= 1.0 for rows in by.values() for r in rows if r["spearman"] == r["spearman"])
