"""Cheap checks of ``MLMDataModule`` arguments, one actionable line each.

Run before any heavy work, so a typo in ``data.*`` fails in a second, not after tokenising a corpus.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from .tokenizer import MIN_VOCAB

SOURCES = ("embedded", "files", "hub")
HUB_KEYS = {"path", "name", "split", "text_column", "streaming", "data_files", "revision"}
TOKENIZER_KEYS = {"name_or_path", "vocab_size", "min_frequency", "max_training_documents"}


def plain(x):
    """Hydra passes DictConfig/ListConfig: turn them into dict/list (other values unchanged)."""
    return OmegaConf.to_container(x, resolve=True) if OmegaConf.is_config(x) else x


def validate_data_args(source, files, hub, tokenizer, block_size, batch_size, val_fraction, val_blocks,
                       num_workers, mlm_probability, max_documents, limit_blocks, num_proc=None,
                       tokenize_chunk_mb=1.0, pin_memory="auto") -> None:
    """Raise ``ValueError`` naming the ``data.*`` key and what to set it to."""
    if source not in SOURCES:
        raise ValueError(f"unknown data.source {source!r}; choose one of {', '.join(SOURCES)}")
    if source == "files" and not files:
        raise ValueError("data.source=files needs data.files=[a.txt,b.txt.gz] (one document per line)")
    if source == "hub" and (hub or {}).get("streaming", True) and not max_documents:
        raise ValueError("data.source=hub streams the dataset: set data.max_documents (e.g. 10000), or "
                         "data.hub.streaming=false to download and use the whole dataset")
    if not (tokenizer or {}).get("name_or_path") and int((tokenizer or {}).get("vocab_size", 8192)) < MIN_VOCAB:
        raise ValueError(f"data.tokenizer.vocab_size must be >= {MIN_VOCAB} for byte-level BPE (256 bytes + 5 "
                         f"special tokens), got {tokenizer['vocab_size']}")
    if not isinstance(block_size, int) or block_size < 2:
        raise ValueError(f"data.block_size must be an integer >= 2 (<s> plus at least one text token), "
                         f"got {block_size!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"data.batch_size must be an integer >= 1, got {batch_size!r}")
    if not 0 <= float(val_fraction) < 1:
        raise ValueError(f"data.val_fraction must be in [0, 1), got {val_fraction}")
    if val_blocks is not None and int(val_blocks) < 0:
        raise ValueError(f"data.val_blocks must be >= 0 or null, got {val_blocks}")
    if num_workers != "auto" and (not isinstance(num_workers, int) or isinstance(num_workers, bool)
                                  or num_workers < 0):
        raise ValueError(f"data.num_workers must be auto or an integer >= 0 (0: collate in the training process), "
                         f"got {num_workers!r}")
    if pin_memory != "auto" and not isinstance(pin_memory, bool):
        raise ValueError(f"data.pin_memory must be auto, true or false, got {pin_memory!r}")
    if mlm_probability is not None and not 0 < float(mlm_probability) < 1:
        raise ValueError(f"data.mlm_probability must be in (0, 1), got {mlm_probability}")
    if num_proc is not None and (not isinstance(num_proc, int) or num_proc < 1):
        raise ValueError(f"data.num_proc must be an integer >= 1 (tokenizing processes) or null (all cores), "
                         f"got {num_proc!r}")
    if not isinstance(tokenize_chunk_mb, (int, float)) or not 0 < tokenize_chunk_mb <= 1024:
        raise ValueError(f"data.tokenize_chunk_mb must be in (0, 1024] (millions of characters per tokenizer "
                         f"chunk; 1 is plenty), got {tokenize_chunk_mb!r}")
    cap = (tokenizer or {}).get("max_training_documents")
    if cap is not None and (not isinstance(cap, int) or cap < 1):
        raise ValueError(f"data.tokenizer.max_training_documents must be an integer >= 1 or null (all), got {cap!r}")
    for name, v in (("max_documents", max_documents), ("limit_blocks", limit_blocks)):
        if v is not None and int(v) < 1:
            raise ValueError(f"data.{name} must be >= 1 or null, got {v}")
    if hub and set(hub) - HUB_KEYS:
        raise ValueError(f"unknown data.hub option(s) {sorted(set(hub) - HUB_KEYS)}; allowed: {sorted(HUB_KEYS)}")
    if tokenizer and set(tokenizer) - TOKENIZER_KEYS:
        raise ValueError(f"unknown data.tokenizer option(s) {sorted(set(tokenizer) - TOKENIZER_KEYS)}; "
                         f"allowed: {sorted(TOKENIZER_KEYS)}")
