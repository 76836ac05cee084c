"""The shared sentence pass in ONE forward pass, one layer in memory at a time (issue 39).

The two-pass design (:mod:`outlierlab.evaluation.streaming`, ``one_pass=False``) encodes the evaluation
sentences once to fit clip's dims and the fitted transforms and again to apply them.  Here the encoder runs
once, layer by layer (:meth:`outlierlab.models.loading.FrozenEncoder.forward_layers`): as each layer arrives,
its valid tokens go into single-layer accumulators (raw outlier counts, the float64 whitener sums, the
anisotropy reservoir, the activation metrics; the word statistics of the transforms already known only when no
replay follows — otherwise the replay takes them, one layer at a time) and into
a :class:`outlierlab.datamodules.features.LayerTokenStore` (the model's dtype, on disk).  Once the transforms
are fitted from the streamed sums, :func:`replay` reads the stored tokens back one layer at a time and
accumulates the statistics of the transforms fitted only now — the same numbers as a second encoding, since
the encoder is deterministic in eval mode.

Every accumulator here is a single-layer instance of the class the two-pass code uses;
:func:`~outlierlab.analysis.layer_accumulators.stack_layers` joins them into the ``L+1``-layer accumulator the analyses read, so both paths give the
same results (tests/test_one_pass.py compares them for every analysis × transform).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from outlierlab.analysis.layer_accumulators import layer_views, stack_layers  # noqa: F401 (re-exported)
from outlierlab.analysis.outlier_stats import OutlierAccumulator
from outlierlab.analysis.similarity import SelfSimilarityAccumulator, intra_sentence_similarity
from outlierlab.analysis.transforms import Whitener
from outlierlab.datamodules.features import LayerTokenStore
from outlierlab.evaluation.disk_room import check_room
from outlierlab.evaluation.encoding import EncodeLog, finish_encode_log, iter_batches, progress_bar
from outlierlab.evaluation.words import plan_vectors, word_plan
from outlierlab.utils.memory import release_freed_memory

@dataclass
class Replay:
    """What the single pass kept for the transforms fitted after it: the token store and, per batch, its
    first stored row, its number of valid tokens, its word plan (indices into the stored rows) and size."""

    store: LayerTokenStore | None
    batches: list[tuple[int, int, Any, int]] = field(default_factory=list)
    devices: dict[int, torch.device] = field(default_factory=dict)  # where each layer ran: the replay runs there


class _Transforms:
    """Each transform restricted to one layer (``FittedTransform.select``), built once per (name, layer)."""

    def __init__(self, ft, dim: int) -> None:
        self.ft, self.dim, self.cache = ft, dim, {}

    def __call__(self, name: str, layer: int, x: Tensor) -> Tensor:
        if name == "none":
            return x
        key = (name, layer)
        if key not in self.cache:
            self.cache[key] = self.ft.get(name, self.dim).select([layer])
        return self.cache[key](x)


def _word_layer(st, sims: dict, names: list[str], layer: int, flat: Tensor, plan, bsz: int, tf: _Transforms) -> None:
    """Intra-sentence similarity and self-similarity sums of one layer of one batch (Ethayarajh 2019)."""
    wv, mask, keys = plan_vectors(flat, plan, bsz)  # [1, B, W, d]
    has_words = mask.any(1)
    flat_keys = keys.flatten()
    target = (flat_keys >= 0).nonzero().flatten()
    for name in names:
        tv = tf(name, layer, wv)
        if has_words.any():  # every sentence with words (the common case): no boolean-index copy
            x, m = (tv, mask) if bool(has_words.all()) else (tv[:, has_words], mask[has_words])
            intra = intra_sentence_similarity(x, mask=m)  # [1, B']
            st.intra_sum[name][layer] += intra.sum(1).cpu()[0]
        if target.numel():
            rows = tv.reshape(1, -1, tv.shape[-1])
            sims[name][layer].update(rows[:, target.to(rows.device)], flat_keys[target])


def _plan_on_rows(plan, valid: Tensor):
    """A word plan over the ``[B, T]`` grid re-indexed to the batch's valid tokens (the stored rows)."""
    src, dst, counts, keys, w_max = plan
    row_of = torch.cumsum(valid.flatten().long().cpu(), 0) - 1
    return row_of[src], dst, counts, keys, w_max


def layer_pass(encoder, texts, st, now: list[str], whitener_new, word_index: dict, lowercase: bool,
               need_words: bool, keep_for_later: bool, batch_size, chunk: int, progress: bool,
               desc: str) -> tuple[Whitener | None, Replay]:
    """The single forward pass: fills ``st`` (outliers and word statistics of ``now``, the anisotropy
    reservoir, the activation metrics) and returns the stacked whitener sums (``whitener_new(1, d)`` per
    layer, or None) and the :class:`Replay` for the transforms fitted afterwards."""
    n_layers, d = st.num_layers, st.dim
    tf = _Transforms(st.transforms, d)
    out_names = ["none"] + [n for n in now if n != "none" and n in st.outliers]
    outs = {n: [OutlierAccumulator(1, st.transforms.out_dim(n, d)) for _ in range(n_layers)] for n in out_names}
    wh_full = whitener_new(n_layers, d) if whitener_new is not None else None
    wh = layer_views(wh_full) if wh_full is not None else None  # the O(L·d²) sums are allocated once
    res = st.anisotropy_acc
    aniso = layer_views(res) if res is not None else None  # the reservoir [L, capacity, d], filled in place
    sim_names = [n for n in now if n in st.self_sim]
    sims = {n: layer_views(st.self_sim[n]) for n in sim_names}  # rows of the [L, K, d] sums: never twice
    if st.activations is not None:
        st.activations.start_layers()
    if keep_for_later:  # fails in one line now, not with ENOSPC hours into the pass
        check_room(encoder, texts, "the one-pass evaluation's token store and fitted maps",
                   "set TMPDIR to a larger disk, or encode twice without storing tokens: data.one_pass=false",
                   extra_bytes=2 * n_layers * d * d * 4)
    store = LayerTokenStore(tempfile.mkdtemp(prefix="outlierlab-replay-"), n_layers, d) if keep_for_later else None
    kept, log_ = Replay(store), EncodeLog()
    bar = progress_bar(len(texts), f"{desc} {getattr(getattr(encoder, 'source', None), 'name', '')}", progress)
    try:
        for b in iter_batches(encoder, texts, batch_size, chunk, offsets=need_words, bar=bar, stats=log_,
                              layerwise=True):
            valid = b.valid
            bsz = valid.shape[0]
            sid = torch.arange(bsz, device=valid.device)[:, None].expand_as(valid)[valid]
            ids = b.input_ids[valid] if b.input_ids is not None else None
            plan = word_plan(b, word_index, valid.shape[1], lowercase) if need_words else None
            plan = _plan_on_rows(plan, valid) if plan is not None else None
            start = store.rows_written[0] if store is not None else 0

            def fn(layer: int, h: Tensor) -> None:
                v = valid.to(h.device)
                raw = h[v]  # [N, d] in the model's dtype
                tok = raw.float()[None]  # [1, N, d]: what the accumulators get (they upcast to float64)
                for n in out_names:
                    outs[n][layer].update(tf(n, layer, tok))
                if st.activations is not None:
                    st.activations.observe_layer(layer, tok[0], ids)
                if wh is not None:
                    wh[layer].partial_fit(tok)
                if aniso is not None:
                    aniso[layer].update(tok, sid.to(h.device))
                if store is not None:
                    store.append(layer, raw)
                    kept.devices[layer] = h.device
                if plan is not None and sim_names:
                    _word_layer(st, sims, sim_names, layer, tok, plan, bsz, tf)

            b.layers(fn)
            if st.activations is not None:
                st.activations.commit(b.attention_mask)
            if plan is not None:
                n_with_words = int((plan[2].reshape(bsz, -1) > 0).any(1).sum())
                for n in sim_names:
                    st.intra_n[n] += n_with_words
            kept.batches.append((start, int(valid.sum()), plan, bsz))
    except BaseException:
        if store is not None:
            store.cleanup()  # nothing will replay it
        raise
    finally:
        if bar is not None:
            bar.close()
        if store is not None:
            store.close()
    finish_encode_log(log_, desc, st.notes)
    st.passes.append(log_)
    for n in out_names:
        st.outliers[n] = stack_layers(outs[n])
    for n in sim_names:
        st.self_sim[n] = stack_layers(sims[n], base=st.self_sim[n])
    if aniso is not None:
        st.anisotropy_acc = stack_layers(aniso, base=res)
    if st.activations is not None:
        st.activations.finish_layers()
    return (stack_layers(wh, base=wh_full) if wh is not None else None), kept


def fit_from_store(fit, store: LayerTokenStore, spans, devices: dict, num_layers: int, dim: int, names,
                   keep_cov: bool = False) -> Whitener:
    """The fitted transforms' sums from the tokens a pass stored, one layer at a time (issue 39): the same
    float64 sums as streaming them along the pass (the same chunks in the same order), never ``(L+1)·d²`` of them
    beside the model's forward.  The forward's freed buffers go back to the OS first, or the fit's state would
    add to them.

    Parameters
    ----------
    fit : :class:`outlierlab.analysis.transform_fit.WhitenSettings`
    spans : per batch ``(first stored row, rows, multiplicities or None)`` — a row fed ``m`` times counts ``m``
        times, as WiC's repeated sentences do
    devices : where each layer ran (the sums are taken there)
    names, keep_cov : the maps to be fitted and whether Σ is kept (:meth:`WhitenSettings.fit_by_layer`)

    Σ and the fitted maps are written to files beside the token store
    (:class:`outlierlab.utils.disk_layers.DiskLayers`) and read back one layer at a time by the replay, the
    anisotropy and WiC transforms and IsoScore: ``(L+1)·2d²`` float32 (40 GiB at 70B) never sits in memory.
    """
    release_freed_memory()

    def chunks(layer: int):
        for start, n_rows, mult in spans:
            x = store.rows(layer, start, start + n_rows).to(devices.get(layer, "cpu")).float()
            yield x if mult is None else x.repeat_interleave(mult.to(x.device), dim=0)

    # Σ and the maps go to files beside the token store, read back one layer at a time by every reader
    return fit.fit_by_layer(num_layers, dim, chunks, names, keep_cov=keep_cov, on_disk=store.directory.parent)


def replay(st, later: list[str], rp: Replay, words_now: Sequence[str] = ()) -> None:
    """The statistics of ``later`` (transforms fitted after the pass) from the stored tokens, one layer at a
    time, batch by batch in the pass's order (so the float64 sums add up in the same order), and the word
    statistics (intra-sentence and self-similarity) of ``words_now``, transforms the pass already applied.

    Self-similarity's ``[K, d]`` sums exist for one layer at a time: each layer's are compacted to their
    squared norms (:meth:`SelfSimilarityAccumulator.compact`) before the next layer starts (issue 39).  Taking
    the first pass's word sums here too (``words_now``) is what keeps them out of memory during the forward:
    they would be ``[L, K, d]`` float64 there (4.9 GiB at 70B with 1,000 words); the numbers are the same."""
    if rp.store is None:
        return
    n_layers, d = st.num_layers, st.dim
    tf = _Transforms(st.transforms, d)
    out_names = [n for n in later if n != "none" and n in st.outliers]
    # word statistics wanted (streaming's setup made their intra-sentence sums)
    sim_names = [n for n in dict.fromkeys([*words_now, *later]) if n in st.intra_sum]
    outs = {n: [OutlierAccumulator(1, st.transforms.out_dim(n, d)) for _ in range(n_layers)] for n in out_names}
    sims: dict[str, list] = {n: [None] * n_layers for n in sim_names}
    keys = range(len(st.words))
    try:
        for layer in range(n_layers):
            tf.cache.clear()  # one layer's maps (and their float32 copies) at a time
            for n in sim_names:
                sims[n][layer] = SelfSimilarityAccumulator(1, st.transforms.out_dim(n, d), keys)
            for start, n_rows, plan, bsz in rp.batches:
                tok = rp.store.rows(layer, start, start + n_rows).to(rp.devices.get(layer, "cpu")).float()[None]
                for n in out_names:
                    outs[n][layer].update(tf(n, layer, tok))
                if plan is not None and sim_names:
                    _word_layer(st, sims, sim_names, layer, tok, plan, bsz, tf)
            for n in sim_names:
                sims[n][layer].compact()
    finally:
        rp.store.cleanup()
    for start, n_rows, plan, bsz in rp.batches:
        if plan is not None:
            n_with_words = int((plan[2].reshape(bsz, -1) > 0).any(1).sum())
            for n in sim_names:
                st.intra_n[n] += n_with_words
    for n in out_names:
        st.outliers[n] = stack_layers(outs[n])
    for n in sim_names:
        st.self_sim[n] = stack_layers(sims[n])
