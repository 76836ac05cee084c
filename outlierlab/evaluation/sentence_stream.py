"""One per-layer stream of token vectors that analyses subscribe to.

A ``LayerStream`` encodes texts once, one layer in memory at a time (``FrozenEncoder.forward_layers``), and hands every
layer of every batch (its valid token vectors) to each subscribed ``Consumer`` exactly once, raw or transformed,
as tokens or words (the mean of each word's subwords, Ethayarajh 2019).

A transform fitted on the same vectors is applied in a second loop — **the fit is a phase between two loops**:

.. code-block:: python

    stream = LayerStream(encoder, texts, keep_tokens=True)
    stream.forward([raw_counts, reservoir])          # loop 1: the encoder's forward, raw vectors
    whitener = stream.fit(settings, ["whiten"])      # the fit: from the stored tokens, one layer at a time
    stream.replay([clip_counts, whiten_words], transforms)  # loop 2: the stored tokens, one layer at a time

The replay reads the tokens the forward stored (model dtype) one layer at a time in the forward's batch order: the
same numbers as a second encoding.  Without a store (``keep_tokens=False``) the replay *is* a second forward.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from outlierlab.datamodules.features import LayerTokenStore
from outlierlab.utils.disk_room import check_room
from outlierlab.metrics.outlier_stats import valid_token_mask
from outlierlab.evaluation.encoding import EncodeLog, finish_encode_log, token_offsets
from outlierlab.evaluation.words import plan_vectors, word_plan
from outlierlab.utils.memory import release_freed_memory
from outlierlab.utils.progress import progress_bar

__all__ = ["Consumer", "LayerStream", "StreamBatch", "WordVectors"]


@dataclass
class StreamBatch:
    """One encoded batch as every consumer sees it: its rows and texts, ``n_tokens`` valid tokens (``valid [B, T]``,
    row-major; ``sentence_ids``/``token_ids`` ``[N]``), ``attention_mask`` (None in a replay), its ``word_plan``, its
    first row in the token store (``start``) and, where asked, character offsets and special masks."""

    index: int
    n_rows: int
    n_tokens: int
    sentence_ids: Tensor
    token_ids: Tensor | None
    attention_mask: Tensor | None
    words: Any
    start: int
    rows: list[int]
    valid: Tensor
    texts: list[str]
    offsets: list | None = None
    special: list | None = None

    def n_with_words(self) -> int:
        """Sentences of the batch with at least one word."""
        return 0 if self.words is None else int((self.words[2].reshape(self.n_rows, -1) > 0).any(1).sum())


class WordVectors(NamedTuple):
    """A batch's word vectors in one layer: ``vectors [1, B, W, d']``, ``mask [B, W]``, ``keys [B, W]``."""

    vectors: Tensor
    mask: Tensor
    keys: Tensor


class Consumer:
    """An analysis' subscription to a ``LayerStream``: set ``transform`` and ``words``, implement ``update``. ``update``
    comes once per (layer, batch): in the forward a batch's layers before the next batch, in a replay a layer's batches
    before the next layer.  Vectors are shared: never modify them in place."""

    transform: str = "none"
    words: bool = False
    #: what it accumulates, when other analyses may want the very same (e.g. ``("outlier_counts", "none")``):
    #: consumers with equal keys are subscribed once and shared (:meth:`SharedPasses.subscribe
    #: <outlierlab.evaluation.registry.SharedPasses.subscribe>`); None: its own
    key: Any = None

    def start(self, stream: "LayerStream") -> None:
        """Once, before the first layer it is fed: state sized by the stream (``num_layers``, ``dim``, ...)."""

    def open(self, stream: "LayerStream") -> None:
        """Before the forward (e.g. hooks on the model)."""

    def start_batch(self, batch: StreamBatch) -> None:
        """Before the forward of ``batch`` (the forward only; e.g. what hooks inside the model will need)."""

    def update(self, layer: int, vectors: Tensor | WordVectors, batch: StreamBatch) -> None:
        """One layer of one batch: token vectors ``[1, N, d']`` float32, or ``WordVectors``."""
        raise NotImplementedError

    def end_batch(self, batch: StreamBatch) -> None:
        """After the last layer of ``batch`` (the forward only)."""

    def end_layer(self, layer: int) -> None:
        """``layer`` has been seen in full (a replay: before the next layer; the forward: after the pass)."""

    def close(self) -> None:
        """After the forward, also when it failed (remove hooks)."""

    def result(self) -> Any:
        """What it accumulated, read once the pass is over (default: the consumer itself)."""
        return self


class _LayerTransforms:
    """Each transform restricted to one layer (``FittedTransform.select``), built once per (name, layer)."""

    def __init__(self, transforms, dim: int) -> None:
        self.ft, self.dim, self.cache = transforms, dim, {}

    def __call__(self, name: str, layer: int, x: Tensor) -> Tensor:
        if name == "none":
            return x
        if (name, layer) not in self.cache:
            self.cache[(name, layer)] = self.ft.get(name, self.dim).select([layer])
        return self.cache[(name, layer)](x)


class LayerStream:
    """The texts' token vectors, one layer at a time, for any number of consumers.

    ``encoder``: a ``FrozenEncoder`` (or anything with its ``tokenize``/``batches``); ``texts`` encoded ``chunk`` at a
    time, ``batch_size`` per forward.  ``word_index``: target word -> index for word consumers (``lowercase``: match
    case-insensitively).  ``keep_tokens``: store valid tokens on disk for ``replay`` and ``layer_chunks``.  ``offsets``:
    give batches their character offsets.  ``room``: ``(what, advice, extra_bytes)`` of the free-disk check.
    """

    def __init__(self, encoder, texts: Sequence[str], *, batch_size: int | None = None, chunk: int = 1024,
                 word_index: dict | None = None, lowercase: bool = True, keep_tokens: bool = False,
                 progress: bool = False, offsets: bool = False, room: tuple[str, str, int] | None = None) -> None:
        if not all(hasattr(encoder, a) for a in ("num_layers", "hidden_size", "tokenize")):
            raise TypeError(f"encoder is a {type(encoder).__name__}: pass the encoder ol.load_encoder(...) returns")
        if isinstance(texts, (str, bytes)):  # list() of it is its characters, each encoded as a sentence
            raise TypeError("texts is a single string: pass a list of sentences, e.g. texts=[text]")
        if getattr(texts, "columns", None) is not None:  # a DataFrame iterates over its column names
            raise TypeError(f"texts is a {type(texts).__name__}: pass the sentences of one column as a list, "
                            "e.g. texts=df['text'].tolist()")
        self.encoder, self.texts = encoder, list(texts)
        bad = [f"[{i}] {type(t).__name__}" for i, t in enumerate(self.texts) if not isinstance(t, str)][:8]
        if bad:
            raise TypeError(f"texts has items that are not strings: {', '.join(bad)}; pass sentences (str)")
        self.num_layers, self.dim = encoder.num_layers + 1, encoder.hidden_size
        self.batch_size, self.chunk, self.progress = batch_size, chunk, progress
        self.word_index, self.lowercase, self.keep_tokens = word_index, lowercase, keep_tokens
        self.offsets = offsets or word_index is not None
        self.room = room or ("the one-pass evaluation's token store and fitted maps",
                             "set TMPDIR to a larger disk, or encode twice without storing tokens: data.one_pass=false",
                             2 * self.num_layers * self.dim * self.dim * 4)
        self.store: LayerTokenStore | None = None
        self.devices: dict[int, torch.device] = {}  # where each layer ran: its replay and fit run there
        self.batches: list[StreamBatch] = []
        self.logs: list[EncodeLog] = []  # one per forward
        self.notes: list[str] = []
        self.started: set[int] = set()  # the consumers whose start() ran

    # ------------------------------------------------------------------------------------------ loop 1
    def forward(self, consumers: Sequence[Consumer], transforms=None, desc: str = "pass 1/1") -> None:
        """The encoder's forward: each consumer gets every layer of every batch once, its transform ready."""
        tf = _LayerTransforms(transforms, self.dim)
        if self.keep_tokens and self.store is None:  # fails in one line now, not with ENOSPC hours into the pass
            what, advice, extra = self.room
            check_room(self.encoder, self.texts, what, advice, extra_bytes=extra)
            self.store = LayerTokenStore(tempfile.mkdtemp(prefix="outlierlab-replay-"), self.num_layers, self.dim)
        store = self.store if not self.logs else None  # a second forward (no store) stores nothing
        log_, batches = EncodeLog(), []
        name = getattr(getattr(self.encoder, "source", None), "name", "")
        # tqdm on a terminal; plain "[evaluate] ..." lines with an ETA in a log file
        bar = progress_bar(len(self.texts), f"[evaluate] {desc} {name}", self.progress, unit="sentences")
        opened = []
        self._start(consumers)
        try:
            for c in consumers:
                c.open(self)
                opened.append(c)
            for sb, run in self._batches(len(batches), store, log_, bar):

                def fn(layer: int, h: Tensor, sb=sb) -> None:
                    raw = h[sb.valid.to(h.device)]  # [N, d] in the model's dtype
                    self._feed(consumers, tf, layer, raw.float()[None], sb)
                    if store is not None:
                        store.append(layer, raw)
                        self.devices[layer] = h.device

                for c in consumers:
                    c.start_batch(sb)
                t0 = time.perf_counter()
                run(fn)  # the batch's forward, one layer at a time
                log_.seconds += time.perf_counter() - t0
                for c in consumers:
                    c.end_batch(sb)
                batches.append(sb)
        except BaseException:
            self.close()  # nothing will replay the stored tokens
            raise
        finally:
            for c in opened:
                c.close()
            if bar is not None:
                bar.close()
            if store is not None:
                store.close()
        for layer in range(self.num_layers):
            for c in consumers:
                c.end_layer(layer)
        if not self.logs:
            self.batches = batches
            finish_encode_log(log_, desc, self.notes, self.encoder.max_length)
        self.logs.append(log_)

    def _batches(self, first: int, store, log_: EncodeLog, bar) -> Iterator[tuple[StreamBatch, Any]]:
        """``(batch, run)`` per batch, ``run(fn)`` feeding ``fn(layer, [B, T, d])``; chunks sorted by length."""
        chunk = max(1, int(self.chunk))
        for c0 in range(0, len(self.texts), chunk):
            part = self.texts[c0:c0 + chunk]
            tok = self.encoder.tokenize(part, report=False)
            log_.n_truncated += tok.n_truncated
            log_.truncated_tokens += tok.truncated_tokens
            offs, special = token_offsets(self.encoder, tok) if self.offsets else (None, None)
            for b in self.encoder.batches(tok, self.batch_size, sort_by_length=True, layerwise=True):
                idx = b.index.tolist()
                log_.n_tokens += int(b.attention_mask.sum())
                log_.n_texts += len(idx)
                yield self._stream_batch(first, b, c0, idx, part, offs, special, store), b.layers
                first += 1
                if bar is not None:
                    bar.update(len(idx))

    def _stream_batch(self, index: int, b, c0: int, idx: list[int], part, offs, special, store) -> StreamBatch:
        dev = b.attention_mask.device
        valid = valid_token_mask(b.attention_mask, b.special_tokens_mask).to(dev)
        bsz = valid.shape[0]
        sb = StreamBatch(index, bsz, int(valid.sum()), torch.arange(bsz, device=dev)[:, None].expand_as(valid)[valid],
                         b.input_ids.to(dev)[valid], b.attention_mask.to(dev), None,
                         store.rows_written[0] if store is not None else 0, [c0 + i for i in idx], valid,
                         [part[i] for i in idx], None if offs is None else [offs[i] for i in idx],
                         None if special is None else [special[i] for i in idx])
        if self.word_index is not None:  # the plan over the [B, T] grid re-indexed to the batch's valid tokens
            plan = word_plan(sb, self.word_index, valid.shape[1], self.lowercase)
            if plan is not None:
                src, dst, counts, keys, w_max = plan
                row_of = torch.cumsum(valid.flatten().long().cpu(), 0) - 1
                sb.words = (row_of[src], dst, counts, keys, w_max)
        return sb

    def _feed(self, consumers: Sequence[Consumer], tf: _LayerTransforms, layer: int, tok: Tensor,
              sb: StreamBatch) -> None:
        """Every consumer's view of one layer of one batch; each (transform, tokens|words) computed once.  Words
        are pooled from transformed tokens: every transform is affine, so this equals transforming the mean."""
        views: dict[tuple[str, bool], Any] = {}
        for c in consumers:
            key = (c.transform, c.words)
            if key not in views:
                if c.words and sb.words is None:
                    continue
                if (c.transform, False) not in views:
                    views[(c.transform, False)] = tf(c.transform, layer, tok)
                if c.words:
                    vectors, mask, keys = plan_vectors(views[(c.transform, False)], sb.words, sb.n_rows)
                    views[key] = WordVectors(vectors, mask, keys)
            c.update(layer, views[key], sb)

    # ------------------------------------------------------------------------------------------- the fit
    def layer_chunks(self, layer: int, repeat: Sequence[Tensor | None] | None = None) -> Iterator[Tensor]:
        """The stored tokens of ``layer``, batch by batch, float32; ``repeat``: per-token counts (None: once)."""
        if self.store is None:
            raise RuntimeError("layer_chunks needs the stored tokens: LayerStream(..., keep_tokens=True)")
        for i, sb in enumerate(self.batches):
            x = self.store.rows(layer, sb.start, sb.start + sb.n_tokens).to(self.devices.get(layer, "cpu")).float()
            mult = None if repeat is None else repeat[i]
            yield x if mult is None else x.repeat_interleave(mult.to(x.device), dim=0)

    def fit(self, settings, names, keep_cov: bool = False, repeat: Sequence[Tensor | None] | None = None):
        """The fitted transforms from the stored tokens, layer by layer; Σ and the maps on disk (``DiskLayers``)."""
        release_freed_memory()
        return settings.fit_by_layer(self.num_layers, self.dim, lambda layer: self.layer_chunks(layer, repeat),
                                     names, keep_cov=keep_cov, on_disk=self.store.directory.parent)

    # ------------------------------------------------------------------------------------------ loop 2
    def replay(self, consumers: Sequence[Consumer], transforms, desc: str = "pass 2/2 (apply)") -> None:
        """Every layer once more for ``consumers``, from the stored tokens (else a second forward); store removed."""
        if not consumers:
            self.close()
            return
        if self.store is None:
            self.forward(consumers, transforms, desc)
            return
        tf = _LayerTransforms(transforms, self.dim)
        self._start(consumers)
        try:
            for layer in range(self.num_layers):
                tf.cache.clear()  # one layer's maps (and their float32 copies) at a time
                for sb, tok in zip(self.batches, self.layer_chunks(layer)):
                    self._feed(consumers, tf, layer, tok[None], sb)
                for c in consumers:
                    c.end_layer(layer)
        finally:
            self.close()

    def _start(self, consumers: Sequence[Consumer]) -> None:
        """``Consumer.start`` of each consumer not yet fed by this stream."""
        for c in consumers:
            if id(c) not in self.started:
                c.start(self)
                self.started.add(id(c))

    def close(self) -> None:
        """Remove the token store (also after a refused fit: nothing is left in ``$TMPDIR``)."""
        if self.store is not None:
            self.store.cleanup()
            self.store = None
