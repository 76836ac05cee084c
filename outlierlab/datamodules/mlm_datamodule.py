"""``MLMDataModule``: text -> tokenizer -> memory-mapped token file -> blocks -> seeded dynamic masking, resumable.

Pipeline (RoBERTa / fairseq style pretraining data, Liu et al. 2019; docs/data_pipeline.md): documents from
``source`` (``outlierlab.datamodules.corpus``); a tokenizer (``outlierlab.datamodules.tokenizer``: byte-level BPE
trained on them, or any HF one); the documents tokenized in ``num_proc`` processes, ``</s>`` after each, into ONE flat
token file (``outlierlab.datamodules.token_cache``) built once and memory-mapped by every run and rank; blocks cut when
read (``outlierlab.datamodules.token_blocks``), EVERY block ``<s>`` + the next ``block_size - 1`` stream tokens, so
position 0 always carries ``<s>``, the token whose position artefacts Luo et al. (2021) study; a train/validation split
by a seeded permutation of block ids; batches from a ``ResumableSampler`` (``seed + epoch``, sharded by rank; set
``use_distributed_sampler: False``) and the MLM collator seeded per batch (``outlierlab.datamodules.masking``).

Resume: ``state_dict()`` records the data epoch and the batches consumed; ``load_state_dict()`` makes the next train
dataloader skip exactly those.  Call ``prepare_data(); setup("fit")`` before building the model to read ``tokenizer``,
``vocab_size`` and ``pad_token_id``; both are idempotent.
"""
from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import lightning as L
import numpy as np
from torch.utils.data import DataLoader

from . import corpus as corpus_lib
from .token_blocks import BlockDataset, ResumableDataLoader, TokenBlocks
from .data_validation import plain, validate_data_args
from .documents import open_documents
from .masking import CausalLMCollator, DeterministicMLMCollator
from .sampler import ResumableSampler
from .token_cache import FORMAT_VERSION, ensure_token_file, token_cache_path, write_token_file
from .tokenize_parallel import default_num_proc
from .tokenizer import load_or_train_bpe, load_tokenizer, mlm_special_ids

log = logging.getLogger(__name__)

#: ``data.objective``: what the collator makes of a block (``objective=`` sets it with ``model.causal``).
OBJECTIVES = ("mlm", "clm")


def default_cache_dir() -> Path:
    """``$OUTLIERLAB_CACHE`` or ``~/.cache/outlierlab``."""
    return Path(os.environ.get("OUTLIERLAB_CACHE") or "~/.cache/outlierlab").expanduser()


#: DataLoader workers per device process that ``data.num_workers=auto`` gives an accelerator.  One worker masks
#: 4-9M tokens/s (``python benchmarks/input_pipeline.py``), 7-13 times what RoBERTa-base consumes on one H200; the
#: second keeps a batch ready while the first is descheduled.
AUTO_WORKERS = 2


def loader_settings(num_workers: int | str, pin_memory: bool | str, trainer=None) -> tuple[int, bool]:
    """``(num_workers, pin_memory)`` for the loaders of ``trainer``, ``"auto"`` resolved.

    On a CPU (or without a trainer) the training process collates: a worker would take a core from the compute threads
    (~35 % per step on 2 cores).  On an accelerator ``AUTO_WORKERS`` workers per device process (fewer where cores are
    short) mask while the device computes, pinned for CUDA.
    """
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

    accelerator = getattr(trainer, "accelerator", None)
    on_cpu = accelerator is None or isinstance(accelerator, CPUAccelerator)
    if num_workers == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        per_process = cores // max(1, int(getattr(trainer, "num_devices", 1) or 1))
        num_workers = 0 if on_cpu else max(0, min(AUTO_WORKERS, per_process - 1))
    if pin_memory == "auto":
        pin_memory = isinstance(accelerator, CUDAAccelerator)
    return int(num_workers), bool(pin_memory)


def ignore_stop_signals(worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn``: SIGTERM and SIGINT are the training process's to handle.

    Preemption or Ctrl-C reaches the workers too; a worker dying of it fails the training process ("DataLoader worker is
    killed by signal") before it saves ``last.ckpt``.  Ignored here, the trainer saves and shuts them down.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class MLMDataModule(L.LightningDataModule):
    """Masked-LM pretraining data (see module docstring).

    source : {"embedded", "files", "hub"} — the embedded corpus, ``files`` (``.txt``/``.txt.gz``, one document per
        line), or ``datasets.load_dataset(**hub)`` (``path, name, split, text_column, streaming, data_files,
        revision``).
    tokenizer : ``name_or_path`` (null: train byte-level BPE), ``vocab_size`` (default 8192), ``min_frequency``
        (default 2), ``max_training_documents`` (BPE on the first N documents; null: all).
    block_size : tokens per block including ``<s>``; batch_size : blocks per batch per device.
    val_fraction, val_blocks : ``val_blocks`` if given, else ``round(val_fraction * n_blocks)`` (≥ 1 when
        ``val_fraction > 0``); both 0: no validation loader.
    num_workers, pin_memory : or "auto" (``loader_settings``).
    mlm_probability, mask_replace_prob, random_replace_prob : the masking recipe (0.15, 0.8, 0.1); null for clm.
    objective : ``mlm`` (``DeterministicMLMCollator``) or ``clm`` (``CausalLMCollator``, labels = inputs).
    cache_dir : default ``$OUTLIERLAB_CACHE`` or ``~/.cache/outlierlab``; seed : split, shuffling and masking.
    max_documents, limit_blocks : the first N documents (required for streamed hub data) / blocks.
    num_proc : tokenizing processes (None: the machine's cores); tokenize_chunk_mb : millions of characters per
        chunk; the build holds about ``2 x num_proc`` chunks, which bounds its memory.
    """

    def __init__(self, source: str = "embedded", files: Sequence[str] | None = None, hub: dict | None = None,
                 tokenizer: dict | None = None, block_size: int = 128, batch_size: int = 32,
                 val_fraction: float = 0.02, val_blocks: int | None = None, num_workers: int | str = "auto",
                 mlm_probability: float = 0.15, mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1,
                 cache_dir: str | None = None, seed: int = 0, max_documents: int | None = None,
                 limit_blocks: int | None = None, pin_memory: bool | str = "auto", num_proc: int | None = None,
                 tokenize_chunk_mb: float = 1.0, objective: str = "mlm") -> None:
        super().__init__()
        # No save_hyperparameters(): Lightning refuses to log when a datamodule hparam (seed, batch_size ...)
        # differs from the LightningModule's; the run's config.yaml records these values.
        files, hub, tokenizer = plain(files), plain(hub), plain(tokenizer)
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown data.objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if objective == "clm":
            for key, value in (("mlm_probability", mlm_probability), ("mask_replace_prob", mask_replace_prob),
                               ("random_replace_prob", random_replace_prob)):
                if value is not None:
                    raise ValueError(f"data.{key}={value} is a masked-LM setting and objective=clm masks nothing; "
                                     f"drop the override (or use objective=mlm)")
        self.objective = objective
        validate_data_args(source, files, hub, tokenizer, block_size, batch_size, val_fraction, val_blocks, num_workers,
                  mlm_probability, max_documents, limit_blocks, num_proc, tokenize_chunk_mb, pin_memory)
        self.source = source
        self.files = [files] if isinstance(files, str) else (list(files) if files else None)
        self.hub = {"path": "wikimedia/wikipedia", "name": "20231101.en", "split": "train",
                    "text_column": "text", "streaming": True, **(hub or {})}
        self.tokenizer_cfg = {"name_or_path": None, "vocab_size": 8192, "min_frequency": 2,
                              "max_training_documents": None, **(tokenizer or {})}
        self.block_size, self.batch_size = int(block_size), int(batch_size)
        self.val_fraction, self.val_blocks = float(val_fraction), val_blocks
        self.num_workers, self.pin_memory = num_workers, pin_memory  # "auto": resolved by _loader for its trainer
        self.mlm_probability = None if mlm_probability is None else float(mlm_probability)
        self.mask_replace_prob = None if mask_replace_prob is None else float(mask_replace_prob)
        self.random_replace_prob = None if random_replace_prob is None else float(random_replace_prob)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.seed, self.max_documents, self.limit_blocks = int(seed), max_documents, limit_blocks
        self.num_proc = int(num_proc) if num_proc else default_num_proc()
        self.chunk_chars = max(1, int(float(tokenize_chunk_mb) * 1e6))

        self.tokenizer = None
        self.blocks_path: Path | None = None  # the token cache folder (tokens.bin + meta.json)
        self.token_meta: dict[str, Any] | None = None
        self.stats: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self.cache_hits: dict[str, bool] = {}  # after prepare_data: was the tokenizer / were the blocks cached?
        self.train_dataset: BlockDataset | None = None
        self.val_dataset: BlockDataset | None = None
        self.collator: DeterministicMLMCollator | CausalLMCollator | None = None
        self._train_sampler: ResumableSampler | None = None
        self._pending_state: dict | None = None

    # ------------------------------------------------------------------------------------------ tokenizer ids
    @property
    def vocab_size(self) -> int:
        """Embedding rows the model needs (``len(tokenizer)``, includes added special tokens)."""
        return len(self._need_tokenizer())

    @property
    def pad_token_id(self) -> int:
        return self._need_tokenizer().pad_token_id

    @property
    def bos_token_id(self) -> int:
        return mlm_special_ids(self._need_tokenizer())["bos"]

    @property
    def eos_token_id(self) -> int:
        return mlm_special_ids(self._need_tokenizer())["eos"]

    @property
    def mask_token_id(self) -> int:
        return self._need_tokenizer().mask_token_id

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise RuntimeError("call datamodule.prepare_data() and setup('fit') before reading the tokenizer")
        return self.tokenizer

    # ----------------------------------------------------------------------------------------------- build
    def prepare_data(self) -> None:
        """Train/load the tokenizer and build/find the token file (cached on disk; one process builds, others wait)."""
        self._ensure_built()

    def _ensure_built(self) -> None:
        if self.blocks_path is not None:
            return
        t0 = time.perf_counter()
        corpus_id = corpus_lib.corpus_identity(self.source, self.files, self.hub, self.max_documents,
                                               memo_dir=self.cache_dir / "file_hashes")

        def documents():  # a fresh stream per pass; nothing is read unless a cache is missing
            hub = {**self.hub, "cache_dir": str(self.cache_dir / "hf_datasets")}
            return open_documents(self.source, self.files, hub, self.max_documents)

        name = self.tokenizer_cfg["name_or_path"]
        if name:
            tok, trained = load_tokenizer(str(name)), False
        else:
            tok, _, trained = load_or_train_bpe(documents, corpus_id, int(self.tokenizer_cfg["vocab_size"]),
                                                self.cache_dir, int(self.tokenizer_cfg["min_frequency"]),
                                                self.tokenizer_cfg["max_training_documents"])
        ids = mlm_special_ids(tok)
        self.timings["tokenizer_s"] = time.perf_counter() - t0
        path = token_cache_path(self.cache_dir, corpus_id, tok)

        def build(p: Path) -> None:
            docs = documents()
            log.info("building the token cache (format %s: one flat memory-mapped token file, %d process(es)) -> %s",
                     FORMAT_VERSION, self.num_proc, p)
            write_token_file(docs, tok, ids["eos"], p, {"corpus_id": corpus_id, "source": self.source,
                                                        "tokenizer": str(getattr(tok, "name_or_path", "")) or "bpe",
                                                        "special_ids": ids},
                             num_proc=self.num_proc, chunk_chars=self.chunk_chars, fraction=docs.fraction)

        self.token_meta, built = ensure_token_file(path, build)
        self.tokenizer, self.blocks_path = tok, path
        self.cache_hits = {"tokenizer": not trained, "blocks": not built}
        self.timings["prepare_s"] = time.perf_counter() - t0

    def setup(self, stage: str | None = None) -> None:
        """Memory-map the token file and split its blocks into train/validation (idempotent)."""
        if self.train_dataset is not None:
            return
        t0 = time.perf_counter()
        self._ensure_built()
        ids = mlm_special_ids(self.tokenizer)
        blocks = TokenBlocks(self.blocks_path, self.token_meta, self.block_size, ids["bos"], ids["pad"],
                             self.limit_blocks)
        n = len(blocks)
        n_val = self._num_val(n)
        order = np.random.default_rng(self.seed).permutation(n)  # the split of earlier versions, exactly
        row_type = np.int32 if n < 2**31 else np.int64  # 4 bytes per block: ~1% of a uint16 block of 256
        val_rows = np.sort(order[:n_val]).astype(row_type)
        order[n_val:].sort()  # in place: no second copy of a permutation of every block
        train_rows = order[n_val:].astype(row_type)
        del order
        self.train_dataset = BlockDataset(blocks, train_rows)
        self.val_dataset = BlockDataset(blocks, val_rows) if n_val else None
        if self.objective == "clm":
            self.collator = CausalLMCollator(self.tokenizer)
        else:
            self.collator = DeterministicMLMCollator(self.tokenizer, self.mlm_probability, self.seed,
                                                     self.mask_replace_prob, self.random_replace_prob)
        meta = self.token_meta
        self.stats = {**meta, "stream_tokens": int(meta["tokens"]), "blocks": n, "block_size": self.block_size,
                      "pad_tokens": blocks.pad_tokens, "token_file": str(self.blocks_path / "tokens.bin"),
                      "train_blocks": len(train_rows), "val_blocks": int(n_val),
                      "train_tokens": self.train_dataset.real_tokens()}
        self.timings["setup_s"] = time.perf_counter() - t0

    def _num_val(self, n: int) -> int:
        if self.val_blocks is not None:
            n_val = int(self.val_blocks)
        else:
            n_val = int(round(self.val_fraction * n))
            n_val = max(n_val, 1) if self.val_fraction > 0 else 0
        if n - n_val < 1:
            raise ValueError(
                f"the corpus gives only {n} block(s) of block_size={self.block_size}, too few for {n_val} "
                f"validation block(s) plus training; add text, lower data.block_size or data.val_blocks/val_fraction")
        return n_val

    # ---------------------------------------------------------------------------------------- dataloaders
    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def _loader(self, dataset: BlockDataset, sampler: ResumableSampler) -> ResumableDataLoader:
        workers, pin = loader_settings(self.num_workers, self.pin_memory, getattr(self, "trainer", None))
        if workers > 0:
            # Tokenizers warns (and disables its thread pool) when a process forks after using it.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        return ResumableDataLoader(dataset, batch_size=self.batch_size, sampler=sampler,
                                   collate_fn=self.collator, num_workers=workers, pin_memory=pin,
                                   persistent_workers=workers > 0,
                                   worker_init_fn=ignore_stop_signals if workers > 0 else None)

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        rank, world = self._rank_world()
        sampler = ResumableSampler(len(self.train_dataset), self.batch_size, shuffle=True, seed=self.seed,
                                   rank=rank, world_size=world)
        if self._pending_state:
            sampler.load_state_dict(self._pending_state, roll_over=self._rolls_over_epochs())
            self._pending_state = None
        self._train_sampler = sampler
        return self._loader(self.train_dataset, sampler)

    def val_dataloader(self):
        self.setup("fit")
        if self.val_dataset is None:
            return []
        rank, world = self._rank_world()
        sampler = ResumableSampler(len(self.val_dataset), self.batch_size, shuffle=False, rank=rank,
                                   world_size=world)
        return self._loader(self.val_dataset, sampler)

    # ---------------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "batches_consumed"}`` of the training data, read from the trainer's batch counter."""
        sampler = self._train_sampler
        if sampler is None:
            return dict(self._pending_state or {})
        consumed = None
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            consumed = trainer.fit_loop.epoch_loop.batch_progress.current.ready
            limit = trainer.num_training_batches
            if isinstance(limit, int) and consumed >= limit:  # epoch over (also with limit_train_batches)
                consumed = sampler.num_batches
        return {**sampler.state_dict(consumed), **self._layout()}

    def _layout(self) -> dict[str, Any]:
        """What the recorded position refers to; checked on resume."""
        return {"batch_size": self.batch_size, "train_blocks": len(self.train_dataset) if self.train_dataset
                else None, "seed": self.seed, "block_size": self.block_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume: the next ``train_dataloader()`` starts at the recorded batch of the recorded epoch."""
        if state_dict:
            self.setup("fit")
            now = self._layout()
            changed = [f"{k}: {state_dict[k]} -> {now[k]}" for k in now if k in state_dict and state_dict[k] != now[k]]
            if changed:
                warnings.warn("the data differ from the checkpoint's (" + ", ".join(changed) + "); the resumed "
                              "run will not see the data an uninterrupted run would have", stacklevel=2)
            self._pending_state = {"epoch": int(state_dict["epoch"]),
                                   "batches_consumed": int(state_dict["batches_consumed"])}
            if self._train_sampler is not None:  # loader already built (e.g. reload): apply now
                self._train_sampler.load_state_dict(self._pending_state, roll_over=self._rolls_over_epochs())
                self._pending_state = None

    def _rolls_over_epochs(self) -> bool:
        """Does the resumed trainer start a fresh epoch after a complete one?  Lightning does so for
        epoch-based runs; with ``max_steps`` it restarts the restored epoch and expects its remainder."""
        trainer = getattr(self, "trainer", None)
        return trainer is None or trainer.max_steps == -1
