"""Tiny locally saved models and a local stand-in for the hub cache, shared by the one-pass and scale tests
(test_evaluation_scale.py: dtype, revisions, placement; test_one_pass.py: one pass, one layer at a time)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from probe_fixtures import minilm_path

from outlierlab.configuration.analysis_settings import AnisotropySettings, OutliersSettings, SelfSimilaritySettings
from outlierlab.configuration.run_settings import DataSettings

#: run_sentence_pass's settings for the small test passes (the oracle takes the same keywords, and ``anisotropy``).
PASS = dict(outliers=OutliersSettings(method="share", threshold=0.25, k=3.0),
            self_similarity=SelfSimilaritySettings(min_sentences=3, max_words=20, lowercase=True),
            data=DataSettings(chunk=16), seed=0, batch_size=8)
#: the anisotropy reservoir's size in those passes
RESERVOIR = AnisotropySettings(n_sentences=40)


def similarity_pass(encoder, texts, transforms, *, words: bool = True, reservoir: int = RESERVOIR.n_sentences,
                    consumers=(), **settings):
    """``run_sentence_pass`` with the subscribers the anisotropy and self-similarity analyses add: the anisotropy
    reservoir and (``words``) one word-similarity subscriber per transform.  Returns ``(stats, reservoir,
    {transform: WordSimilarity})``; ``settings`` default to :data:`PASS`."""
    from outlierlab.evaluation.sentence_pass import AnisotropyReservoir, WordSimilarity, run_sentence_pass

    settings = {**PASS, **settings}
    pairs = AnisotropyReservoir(reservoir, settings["seed"])
    sims = {t: WordSimilarity(t) for t in transforms} if words else {}
    st = run_sentence_pass(encoder, texts, transforms, need_whitener=True,
                           consumers=[*consumers, pairs, *sims.values()], **settings)
    return st, pairs, sims


def texts(n: int = 40) -> list[str]:
    from outlierlab.datamodules.probe_data import load_position_texts

    return load_position_texts(None, n)


def save_tiny_llama(directory: Path, seed: int = 0, dtype=torch.float32) -> Path:
    """A random 3-layer Llama (pre-RMSNorm decoder) with the MiniLM WordPiece tokenizer, saved in ``dtype``."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(minilm_path())
    cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    model = LlamaModel(cfg).eval()
    with torch.no_grad():  # a massive-activation-like dim so the statistics have something to find
        model.embed_tokens.weight[:, 5] += 4.0
    model.to(dtype).save_pretrained(directory)
    tok.save_pretrained(directory)
    return Path(directory)


def fake_hub(cache: Path, repo: str, revisions: dict[str, Path]) -> None:
    """Lay saved model directories out as the hub client's cache: ``models--org--name/refs/<rev>`` holds a
    commit hash, ``snapshots/<hash>/`` the files."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    for rev, src in revisions.items():
        commit = hashlib.sha1(rev.encode()).hexdigest()
        snap = root / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            (snap / f.name).write_bytes(f.read_bytes())
        (root / "refs" / rev).write_text(commit)
