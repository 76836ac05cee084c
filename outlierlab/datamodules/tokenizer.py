"""Tokenizers for MLM pretraining: a byte-level BPE trained on the corpus (default) or any HF tokenizer.

Default (``tokenizer.name_or_path: null``): byte-level BPE as in RoBERTa (Liu et al. 2019; no unknown tokens), trained
with ``tokenizers`` on the training documents, special tokens in RoBERTa's order and ids -- ``<s>``=0, ``<pad>``=1,
``</s>``=2, ``<unk>``=3, ``<mask>``=4 -- and a ``RobertaProcessing`` post-processor.  Wrapped as
``PreTrainedTokenizerFast`` and cached with ``save_pretrained`` (without its tokenizer_config.json ``AutoTokenizer``
adds no ``<s>``/``</s>``) under ``<cache_dir>/tokenizers/bpe<V>-<hash>``, keyed by corpus, vocab size and recipe.

Otherwise ``name_or_path`` is loaded with ``AutoTokenizer``; a hub id while offline fails at once with one line.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
import warnings
from pathlib import Path
from itertools import islice
from typing import Callable, Iterable

from filelock import FileLock
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from .corpus import hub_is_offline

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # RoBERTa order: ids 0..4
RECIPE = "bytelevel-bpe-v1"  # bump when the training recipe changes, to invalidate caches
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # byte alphabet + specials


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2):
    """Train a RoBERTa-style byte-level BPE on ``texts``; returns a ``PreTrainedTokenizerFast``.

    ``texts`` is streamed once: memory grows with the distinct pre-tokenized words, not the corpus (cap it with
    ``tokenizer.max_training_documents``).  Deterministic; a corpus too small for ``vocab_size`` gives a smaller
    vocabulary, with a warning.
    """
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"data.tokenizer.vocab_size must be >= {MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} "
                         f"special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # <mask> strips the space before it, as in roberta-base, so "the <mask>." tokenizes like "the word."
    specials = [AddedToken(t, special=True, normalized=False, lstrip=(t == "<mask>")) for t in SPECIAL_TOKENS]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer, length=len(texts) if isinstance(texts, (list, tuple)) else None)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                      add_prefix_space=False)
    if tok.get_vocab_size() < vocab_size:
        warnings.warn(f"corpus too small for vocab_size={vocab_size}: trained {tok.get_vocab_size()} tokens",
                      stacklevel=2)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   sep_token="</s>", cls_token="<s>", pad_token="<pad>", mask_token="<mask>")


def bpe_cache_path(cache_dir: str | os.PathLike, corpus_id: str, vocab_size: int, min_frequency: int = 2,
                   max_training_documents: int | None = None) -> Path:
    """Cache folder of the BPE tokenizer for this (corpus, vocab size, recipe, training-sample cap)."""
    fields = {"recipe": RECIPE, "corpus": corpus_id, "vocab_size": vocab_size, "min_frequency": min_frequency}
    if max_training_documents is not None:  # absent when uncapped: caches of earlier versions stay valid
        fields["max_training_documents"] = int(max_training_documents)
    key = json.dumps(fields, sort_keys=True)
    return Path(cache_dir).expanduser() / "tokenizers" / f"bpe{vocab_size}-{_sha(key)[:16]}"


def load_or_train_bpe(texts: Callable[[], Iterable[str]] | Iterable[str], corpus_id: str, vocab_size: int,
                      cache_dir: str | os.PathLike, min_frequency: int = 2, max_training_documents: int | None = None):
    """Load the cached BPE tokenizer for ``corpus_id`` or train it (only then is ``texts()`` called) and cache it.

    With ``max_training_documents`` only that many first documents are read.  Returns ``(tokenizer, path, trained)``.
    Safe with several processes: a file lock serialises training and the folder appears atomically.
    """
    if max_training_documents is not None and int(max_training_documents) < 1:
        raise ValueError(f"data.tokenizer.max_training_documents must be >= 1 or null, got {max_training_documents}")
    path = bpe_cache_path(cache_dir, corpus_id, vocab_size, min_frequency, max_training_documents)
    if not (path / "tokenizer_config.json").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            if not (path / "tokenizer_config.json").is_file():
                docs = texts() if callable(texts) else texts
                if max_training_documents is not None:
                    docs = islice(docs, int(max_training_documents))
                t0 = time.perf_counter()
                tok = train_bpe_tokenizer(docs, vocab_size, min_frequency)
                tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
                tok.save_pretrained(str(tmp))
                if path.exists():  # a broken earlier attempt
                    shutil.rmtree(path)
                os.replace(tmp, path)
                log.info("trained byte-level BPE (vocab %d) in %.1f s%s -> %s", len(tok), time.perf_counter() - t0,
                         "" if max_training_documents is None else
                         f" on the first {int(max_training_documents):,} documents", path)
                return tok, path, True
    return load_tokenizer(str(path)), path, False


def load_tokenizer(name_or_path: str):
    """``AutoTokenizer.from_pretrained(name_or_path)`` with a one-line error when it cannot be loaded offline."""
    local = Path(name_or_path).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ValueError(f"data.tokenizer.name_or_path={name_or_path} is a file; give the tokenizer's folder")
        try:
            return AutoTokenizer.from_pretrained(str(local))
        except Exception as e:
            raise ValueError(f"cannot load a tokenizer from {local} ({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0][:200]}); it needs tokenizer.json or "
                             "vocab files plus tokenizer_config.json (save_pretrained writes them)") from e
    if hub_is_offline():
        try:  # it may be in the local HF cache
            return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
        except Exception:
            raise ConnectionError(
                f"tokenizer {name_or_path!r} is not a local folder and the hub is unreachable (offline); set "
                "data.tokenizer.name_or_path to a folder written by save_pretrained (e.g. a run's hf/ or model/), "
                "or pre-download it (huggingface-cli download " + name_or_path + ")") from None
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except Exception as e:
        raise ValueError(f"cannot load tokenizer {name_or_path!r} ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0][:200]})") from e


def mlm_special_ids(tokenizer) -> dict[str, int]:
    """Ids the packer and collator need: ``bos`` (``<s>``/``[CLS]``), ``eos`` (``</s>``/``[SEP]``), ``pad``, ``mask``;
    ``ValueError`` names what is missing (e.g. GPT-2 has no pad or mask token)."""
    ids = {"bos": tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id,
           "eos": tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id,
           "pad": tokenizer.pad_token_id, "mask": tokenizer.mask_token_id}
    missing = [k for k, v in ids.items() if v is None]
    if missing:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} lacks token(s) needed for MLM: "
                         f"{', '.join(missing)} (bos=<s>/[CLS], eos=</s>/[SEP]); choose an MLM tokenizer")
    return ids


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of the full tokenizer definition (vocab, merges, specials, processors): keys the block cache."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        body = backend.to_str()
    else:  # slow (Python/sentencepiece) tokenizer: vocab + special tokens
        body = json.dumps([type(tokenizer).__name__, sorted(tokenizer.get_vocab().items()),
                           tokenizer.all_special_tokens], default=str)
    return _sha(body)[:16]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
