"""evaluate.py's streaming layer (outlierlab/evaluation/sentence_pass.py, outlierlab/evaluation/analyses/wic.py) against all-in-memory computations.

The encoder is a real FrozenEncoder (tiny BERT directory, real MiniLM WordPiece tokenizer, real batching and
padding) whose forward pass is replaced by a per-token lookup — hidden state = f(token id, position) with a
planted outlier dim — so that the in-memory reference can encode each sentence alone and get exactly
the same vectors.
"""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from outlierlab.evaluation.sentence_pass import AnisotropyReservoir, WordSimilarity, pass_settings, run_sentence_pass
from outlierlab.evaluation.words import char_span_tokens
from sentence_pass_oracle import word_occurrences, word_vectors
from tests.conftest import compose


def yaml_settings(**overrides):
    """run_sentence_pass's settings as configs/evaluate.yaml states them, with ``overrides``: per section, the
    fields to replace (``data={"chunk": 7}``)."""
    settings = pass_settings(compose("evaluate"))
    return {**settings, **{k: replace(settings[k], **v) for k, v in overrides.items()}}

OUTLIER_DIM, D, N_LAYERS = 3, 32, 2  # hidden states: embeddings + 2 layers
WORDS = ("the dog cat saw ran house river bank sea ship captain anne walked quickly slowly green old new "
         "ishmael wentworth kellynch uppercross").split()


def _sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) for _ in range(n)]


def _fake_forward(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(N_LAYERS + 1, vocab, D, generator=g)
    pos = 0.5 * torch.randn(N_LAYERS + 1, 128, D, generator=g)
    offset = torch.zeros(N_LAYERS + 1, 1, 1, D)
    offset[1:, ..., OUTLIER_DIM] = 8.0  # planted outlier: argmax of ~every token in layers 1-2, anisotropic

    def forward(input_ids, attention_mask):
        t = input_ids.shape[1]
        return table[:, input_ids] + pos[:, None, :t] + offset

    return forward


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from outlierlab.models.loading import FrozenEncoder
    from probe_fixtures import save_tiny_bert

    d = save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), layers=N_LAYERS, hidden=D)
    enc = FrozenEncoder(str(d), batch_size=3)
    enc.forward = _fake_forward(len(enc.tokenizer))  # instance attribute: batches() calls self.forward
    # the one-pass path reads the layers one at a time: the same fake states, layer by layer
    enc.forward_layers = lambda ids, attn, fn: [fn(i, h) for i, h in enumerate(enc.forward(ids, attn))]
    return enc


def _reference(encoder, texts):
    """Encode each sentence ALONE (no padding, no chunks) and keep everything in memory."""
    tok = encoder.tokenizer
    tokens, words = [], []  # words: per sentence list of (word, [L, d] vector)
    for text in texts:
        enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        ids = torch.tensor(enc["input_ids"])[None]
        h = encoder.forward(ids, torch.ones_like(ids))[:, 0].to(torch.float64)  # [L, T, d]
        special = torch.tensor(enc["special_tokens_mask"]).bool()
        tokens.append(h[:, ~special])
        # independent word segmentation: the tokenizer's own word ids (texts are lowercase letters + spaces)
        groups: dict[int, list[int]] = {}
        for i, w in enumerate(enc.word_ids()):
            if w is not None:
                groups.setdefault(w, []).append(i)
        split = text.split()
        words.append([(split[w], h[:, idx].mean(1)) for w, idx in sorted(groups.items())])
    return torch.cat(tokens, 1), words


def _self_sim_reference(words, transform, min_sentences):
    occ: dict[str, list] = {}
    for sent in words:
        seen = set()
        for w, v in sent:
            if w not in seen:  # first occurrence per sentence
                occ.setdefault(w, []).append(transform(v))
                seen.add(w)
    values = []
    for w, vs in occ.items():
        if len(vs) < min_sentences:
            continue
        u = torch.nn.functional.normalize(torch.stack(vs, 1), dim=-1)  # [L, n, d]
        c = u @ u.transpose(1, 2)
        n = u.shape[1]
        values.append((c.sum((1, 2)) - c.diagonal(dim1=1, dim2=2).sum(1)) / (n * (n - 1)))  # mean over i != j
    return torch.stack(values, 1).mean(1), len(values)


def _intra_reference(words, transform):
    out = []
    for sent in words:
        v = torch.stack([transform(x) for _, x in sent], 1)  # [L, n, d]
        centre = v.mean(1, keepdim=True)
        out.append(torch.nn.functional.cosine_similarity(v, centre, dim=-1).mean(1))
    return torch.stack(out, 1).mean(1)


def test_streaming_statistics_equal_in_memory(encoder):
    texts = _sentences(60)
    sims = {t: WordSimilarity(t) for t in ("none", "clip", "whiten")}  # the self-similarity analysis' subscribers
    st = run_sentence_pass(encoder, texts, ["none", "clip", "whiten"], batch_size=3, consumers=list(sims.values()),
                           **yaml_settings(self_similarity={"min_sentences": 10, "max_words": None},
                                           data={"chunk": 7}))  # odd sizes on purpose
    x, words = _reference(encoder, texts)  # [L, N, d] every valid token of every sentence
    n = x.shape[1]

    # outlier statistics (Luo §2)
    acc = st.outliers["none"]
    assert acc.count == n
    assert torch.allclose(acc.mean(), x.mean(1), atol=1e-6, rtol=0)
    amax = torch.zeros(N_LAYERS + 1, D, dtype=torch.float64).scatter_add_(1, x.argmax(-1), torch.ones(x.shape[:2],
                                                                                        dtype=torch.float64)) / n
    assert torch.allclose(acc.argmax_share(), amax, atol=1e-12)
    # clip: the planted dim, detected in layers 1-2 only
    assert st.transforms.clip_dims[1] == [OUTLIER_DIM] and st.transforms.clip_dims[2] == [OUTLIER_DIM]
    assert OUTLIER_DIM not in st.transforms.clip_dims[0]

    # whitener fitted on the streamed tokens = fitted on all tokens at once: same mean, same Σ⁻¹ = W Wᵀ
    w = st.transforms.whitener
    mu = x.mean(1)
    cov = torch.stack([torch.from_numpy(np.cov(x[layer].numpy(), rowvar=False)) for layer in range(x.shape[0])])
    assert torch.allclose(w.mean, mu, atol=1e-6, rtol=0)
    # evaluate's fit keeps W in float32 on disk: W Wᵀ = Σ⁻¹ to float32 rounding
    assert w.W.dtype == torch.float32
    wd = w.W[:].double()  # on disk (read one layer at a time): [:] reads the stack
    assert torch.allclose(wd @ wd.transpose(1, 2), torch.linalg.inv(cov), atol=1e-5, rtol=1e-5)

    # reference transforms in float64: clip the detected dims; whiten with an eigh-based W (cosines are
    # invariant to the rotation/sign freedom of W)
    e, u = torch.linalg.eigh(cov)
    w_ref = u / e.sqrt()[:, None, :]
    clip_mask = torch.zeros(N_LAYERS + 1, D, dtype=torch.bool)
    for layer, dims in enumerate(st.transforms.clip_dims):
        clip_mask[layer, dims] = True
    transforms = {"none": lambda v: v,
                  "clip": lambda v: v.masked_fill(clip_mask, 0.0),
                  "whiten": lambda v: ((v - mu)[:, None, :] @ w_ref)[:, 0]}
    for name, tf in transforms.items():
        ref, n_words = _self_sim_reference(words, tf, 10)
        keys, raw = sims[name].result().compute(10)
        assert keys.numel() == n_words > 5
        assert torch.allclose(raw.mean(1), ref, atol=1e-6, rtol=0), name
        assert torch.allclose(sims[name].intra_sentence(), _intra_reference(words, tf), atol=1e-6, rtol=0), name
        assert sims[name].intra_n == len(texts)
    # ONE pass: clip and whiten are applied to the stored tokens, not to a second encoding
    assert [p.n_texts for p in st.passes] == [len(texts)]


def test_whitened_anisotropy_is_near_zero_on_the_fitted_set(encoder):
    # 400 sentences -> 200 cross-sentence pairs; with d = 32 a pair cosine of whitened (isotropic) vectors has
    # sd ~ 1/sqrt(32) = 0.18, so the mean of 200 has sd ~ 0.0125: |anisotropy| < 0.05 is a 4-sigma bound.
    texts = _sentences(400, seed=1)
    settings = yaml_settings()
    pairs = AnisotropyReservoir(400, settings["seed"])  # the anisotropy analysis' subscriber; the maps fitted for it
    st = run_sentence_pass(encoder, texts, ["none", "clip", "whiten"], batch_size=64, need_whitener=True,
                           consumers=[pairs], **settings)
    raw, clipped, white = (pairs.anisotropy(st.transforms, t) for t in ("none", "clip", "whiten"))
    assert pairs.result().n_kept == 400
    assert (raw[1:] > 0.5).all()  # the planted dim dominates every vector of layers 1-2
    assert (clipped[1:] < 0.2).all()  # clipping it removes most of the shared direction
    assert (white.abs() < 0.05).all(), white
    # a self-pair would give cosine 1: never a token with itself, never two tokens of one sentence
    a, b = pairs.result().pair_vectors()
    assert not torch.isclose(torch.nn.functional.cosine_similarity(a[0], b[0], dim=-1), torch.ones(1)).any()


def test_word_spans_average_subwords_and_keep_one_occurrence_per_sentence(encoder):
    tok = encoder.tokenizer
    text = "Ishmael saw the dog, and the dog saw Ishmael's well-bred dog."
    enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    pieces = tok.convert_ids_to_tokens(enc["input_ids"])
    occ = word_occurrences(text, enc["offset_mapping"], enc["special_tokens_mask"])
    assert [w for w, _ in occ] == ["ishmael", "saw", "the", "dog", "and", "the", "dog", "saw", "ishmael's",
                                   "well-bred", "dog"]
    assert [pieces[i] for i in occ[0][1]] == ["is", "##hma", "##el"]  # one word, three subword tokens
    assert [pieces[i] for i in occ[9][1]] == ["well", "-", "bred"]

    ids = torch.tensor(enc["input_ids"])[None]
    hidden = torch.randn(N_LAYERS + 1, 1, ids.shape[1], D, generator=torch.Generator().manual_seed(0))
    b = SimpleNamespace(texts=[text], offsets=[enc["offset_mapping"]], special=[enc["special_tokens_mask"]])
    vecs, mask, keys = word_vectors(hidden, b, {"dog": 0, "ishmael": 1, "saw": 2})
    assert mask.sum() == len(occ)
    # the subword-split word is the mean of its three tokens
    assert torch.allclose(vecs[:, 0, 0], hidden[:, 0, occ[0][1]].mean(1))
    # targets: only the first occurrence in the sentence carries the key ("dog" 3x, "saw" 2x -> once each)
    assert keys[0].tolist() == [1, 2, -1, 0, -1, -1, -1, -1, -1, -1, -1]


def test_wic_target_span_maps_char_offsets_to_tokens(encoder):
    from outlierlab.evaluation.analyses.wic import target_vectors

    tok = encoder.tokenizer
    s1 = "Café owners by the riverbank said the bank was closed."
    s2 = "Ishmael sat on the bank."
    st1 = s1.index("bank was")  # the second "bank", not the one inside "riverbank"
    st2 = s2.index("Ishmael")
    for text, (a, z), want in [(s1, (st1, st1 + 4), ["bank"]), (s2, (st2, st2 + 7), ["is", "##hma", "##el"])]:
        enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        toks = char_span_tokens(enc["offset_mapping"], enc["special_tokens_mask"], a, z)
        assert tok.convert_ids_to_tokens([enc["input_ids"][i] for i in toks]) == want
    # through the WiC encoding path (batched, padded): target vector = mean of those tokens' vectors
    pairs = [{"sentence1": s1, "sentence2": s2, "start1": st1, "end1": st1 + 4, "start2": st2, "end2": st2 + 7,
              "label": False}]
    targets, found, fitted = target_vectors(encoder, pairs * 3)
    vecs = torch.stack([targets.layer(i) for i in range(targets.num_layers)])
    assert fitted is None  # nothing asked to be fitted
    assert found.all()
    enc2 = tok(s2)
    h2 = encoder.forward(torch.tensor(enc2["input_ids"])[None], None)[:, 0]
    assert torch.allclose(vecs[:, 1, 0], h2[:, 1:4].mean(1), atol=1e-6)
    # a span that maps to no token (beyond the text) is reported as not found
    bad = dict(pairs[0], start2=500, end2=505)
    assert target_vectors(encoder, [bad])[1].tolist() == [False]


def test_wic_target_vectors_live_on_disk_one_layer_at_a_time(encoder, tmp_path, monkeypatch):
    """The targets of every layer go to a float32 store under $TMPDIR, a pair never found reads as
    zeros, each layer reads back alone, and the files go with cleanup()."""
    import tempfile

    from outlierlab.evaluation.analyses.wic import target_vectors

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    s1, s2 = "The bank was closed.", "She sat on the bank."
    good = {"sentence1": s1, "sentence2": s2, "start1": 4, "end1": 8, "start2": 16, "end2": 20, "label": False}
    bad = dict(good, start2=500, end2=505)  # its sentence2 target maps to no token
    targets, found, _ = target_vectors(encoder, [good, bad])
    assert found.tolist() == [True, False]
    (store_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith("outlierlab-wic-targets-")]
    assert targets.num_layers == encoder.num_layers + 1 and not list(store_dir.iterdir())  # unnamed files
    stacked = torch.stack([targets.layer(i) for i in range(targets.num_layers)])
    h1 = encoder.forward(torch.tensor(encoder.tokenizer(s1)["input_ids"])[None], None)[:, 0]
    assert torch.allclose(stacked[:, 0, 0], h1[:, 2], atol=1e-6)  # "bank": token 2 of [CLS] the bank ...
    assert torch.equal(targets.layer(1), stacked[1]) and stacked[:, 1, 1].abs().sum() == 0
    targets.cleanup()
    assert not store_dir.exists()
