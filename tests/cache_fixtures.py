"""Shared helpers of the site tests (tests/test_sites.py and the fresh process its disk-cache test measures): our
RobertaMaskedLM (post-LN, pre-LN or the Outlier-Protected block), the corpus and sites the disk-cache test caches,
and the process's current and peak resident memory, the peak reset to the current size (Linux's /proc/self)."""

from __future__ import annotations

import gc

import torch

from probe_fixtures import SENTENCES, byte_level_tokenizer


def ours(kind: str = "post", hidden: int = 32, layers: int = 2, ffn: int = 64, seed: int = 0, tok=None):
    """Our RobertaMaskedLM: post-LN, pre-LN (a final norm) or the Outlier-Protected block (no block norms)."""
    from outlierlab.models import EncoderConfig, RobertaMaskedLM

    tok = tok or byte_level_tokenizer()
    placement, block = ("post", "op") if kind == "op" else (kind, "roberta")
    cfg = EncoderConfig(vocab_size=len(tok), hidden_size=hidden, num_layers=layers, num_heads=2,
                        intermediate_size=ffn, max_len=128, pos={"name": "learned"}, norm_placement=placement,
                        block=block)
    torch.manual_seed(seed)
    model = RobertaMaskedLM(cfg).eval()
    with torch.no_grad():  # peaked predictions, so a changed activation shows in the loss
        model.roberta.embeddings.word_embeddings.weight.normal_(0, 1)
    return model, tok


CACHE_SITES = ["blocks.*.resid", "blocks.*.ffn.pre", "blocks.*.ffn.post"]


def cache_corpus():
    """A model with wide FFNs (much to cache, little to compute) and 40 texts of 128 tokens."""
    model, tok = ours("post", hidden=128, layers=4, ffn=1024)
    return model, tok, [" ".join(SENTENCES[i % 8:] + SENTENCES[:i % 8]) for i in range(40)]


def peak_rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024


def _current_rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def reset_peak() -> float:
    """Reset the process's peak resident memory to its current size (Linux's clear_refs "5"); the size."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _current_rss_mb()
