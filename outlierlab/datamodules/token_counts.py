"""How often each token id occurs in a text list, and in the pretraining corpus of a ``train.py`` run (what
Puccetti et al. 2022 correlate outlier magnitude with): the run's ``config.yaml`` names its data, which is re-read
with ``outlierlab.datamodules.corpus.load_texts`` and tokenised with the run's tokenizer; the counts are cached
under the cache root, keyed by the corpus and the tokenizer.  Used by ``evaluate.py``'s ``frequency`` analysis."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from outlierlab.datamodules.corpus import corpus_identity, load_texts
from outlierlab.datamodules.tokenizer import tokenizer_fingerprint

__all__ = ["count_tokens", "find_run_config", "pretraining_data", "pretraining_counts"]


def count_tokens(tokenizer, texts: Sequence[str], vocab_size: int | None = None, batch_size: int = 2000) -> np.ndarray:
    """Occurrences of every token id in ``texts`` (tokenised without special tokens), int64 [vocab]."""
    size = int(vocab_size or len(tokenizer))
    counts = np.zeros(size, dtype=np.int64)
    for i in range(0, len(texts), batch_size):
        ids = tokenizer(list(texts[i:i + batch_size]), add_special_tokens=False, verbose=False)["input_ids"]
        flat = np.fromiter((t for row in ids for t in row), dtype=np.int64)
        if flat.size:
            counts += np.bincount(flat, minlength=size)[:size]
    return counts


def find_run_config(source) -> Path | None:
    """The train.py config of the run an encoder comes from (``config.yaml`` or ``.hydra/config.yaml``
    in the run directory, found from its ``hf/``/``model/`` export or checkpoint), else None."""
    if source.kind == "hf" and not Path(source.model).exists():
        return None
    p = Path(source.model)
    for d in [p, *list(p.parents)[:2]]:
        for cand in (d / "config.yaml", d / ".hydra" / "config.yaml"):
            if cand.is_file() and OmegaConf.select(OmegaConf.load(cand), "data.source", default=None) is not None:
                return cand
    return None


def pretraining_data(source) -> dict | None:
    """``{source, files, hub, max_documents, config}`` of the run's pretraining data, or None."""
    cfg_path = find_run_config(source)
    if cfg_path is None:
        return None
    cfg = OmegaConf.load(cfg_path)

    def sel(key):  # only these nodes are resolved: the rest may use Hydra-only resolvers
        v = OmegaConf.select(cfg, f"data.{key}", default=None)
        return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v

    return {"source": sel("source"), "files": sel("files"), "hub": sel("hub"),
            "max_documents": sel("max_documents"), "config": str(cfg_path)}


def pretraining_counts(source, tokenizer, cache_dir: Path) -> tuple[np.ndarray, str]:
    """Token counts of the run's pretraining corpus (cached under ``cache_dir/token_counts``); raises FileNotFoundError
    / ValueError / ConnectionError / RuntimeError when its data cannot be read here."""
    data = pretraining_data(source)
    if data is None:
        raise FileNotFoundError(f"{source.name} is not a train.py run (no config.yaml naming data.source)")
    ident = corpus_identity(data["source"], data["files"], data["hub"], data["max_documents"])
    key = hashlib.sha256(json.dumps([ident, tokenizer_fingerprint(tokenizer), len(tokenizer)]).encode()).hexdigest()
    path = cache_dir / "token_counts" / f"{key[:24]}.npy"
    what = f"the run's pretraining corpus (data.source={data['source']}, from {data['config']})"
    if path.is_file():
        return np.load(path), what
    texts = load_texts(data["source"], data["files"], data["hub"], data["max_documents"])
    counts = count_tokens(tokenizer, texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.npy")
    np.save(tmp, counts)
    os.replace(tmp, path)
    return counts, what
