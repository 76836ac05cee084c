"""Texts and labels for the probes (Luo et al. 2021 §3 position probe, §4.4 linear classifiers).

* position probe: sentences from local text files (one per line, ``.txt``/``.txt.gz``) or the shipped
  held-out sentences (``outlierlab.datamodules.eval_data.load_sentences``);
* classifiers: hub tasks through ``datasets`` (``stanfordnlp/sst2``, ``SetFit/sst5``, ``stanfordnlp/imdb``; from
  the local cache when offline), local CSV/JSON files with ``text``/``label`` columns, or the shipped WordNet
  part-of-speech set, each as ``ClassificationData`` with train/validation/test splits (a missing or unlabelled
  split is replaced as recorded in ``notes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import datasets
import numpy as np

from outlierlab.datamodules.corpus import load_texts_from_files
from outlierlab.datamodules.dataset_sources import existing_files, file_builder, load_hub
from outlierlab.datamodules.eval_data import POS_LABELS, load_sentences, load_wordnet_pos

SPLITS = ("train", "validation", "test")


@dataclass
class ClassificationData:
    """``splits[name] = (texts, labels)`` for train/validation/test, labels 0..C-1."""

    splits: dict[str, tuple[list[str], list[int]]]
    label_names: list[str]
    source: str
    notes: list[str] = field(default_factory=list)

    @property
    def num_classes(self) -> int:
        return len(self.label_names)


# ------------------------------------------------------------------------------------------ position probe
def load_position_texts(files: Sequence[str] | str | None = None, max_sentences: int | None = None) -> list[str]:
    """Sentences for the position probe: ``files`` (one per line) or the shipped held-out sentences.

    The first ``max_sentences`` (text order; None = all) are kept, so the cache key is seed-independent.
    """
    texts = load_texts_from_files(files, max_sentences) if files else load_sentences()
    if max_sentences is not None:
        if max_sentences < 1:
            raise ValueError(f"data.max_sentences must be >= 1 or null, got {max_sentences}")
        texts = texts[:max_sentences]
    return texts


def split_indices(n: int, fractions: Sequence[float], seed: int) -> dict[str, np.ndarray]:
    """Random disjoint train/validation/test index sets of ``range(n)`` (sorted), seeded."""
    f = np.asarray(list(fractions), dtype=float)
    if len(f) != 3 or (f < 0).any() or f.sum() <= 0:
        raise ValueError(f"split fractions must be three non-negative numbers, got {list(fractions)}")
    f = f / f.sum()
    perm = np.random.default_rng(seed).permutation(n)
    n_train, n_val = int(round(f[0] * n)), int(round(f[1] * n))
    if n_train < 1 or n - n_train - n_val < 1:
        raise ValueError(f"{n} texts are too few for split fractions {list(fractions)}")
    parts = np.split(perm, [n_train, n_train + n_val])
    return {s: np.sort(p) for s, p in zip(SPLITS, parts)}


# ---------------------------------------------------------------------------------------------- classifiers
def load_classification(task: Mapping, seed: int = 0) -> ClassificationData:
    """Load a classification task described by a ``configs/task/*.yaml`` node.

    Keys: ``source`` (hub | local | wordnet_pos), ``path``/``subset`` (hub), ``files`` (local: list, or
    mapping split -> files), ``text_field``, ``label_field``, ``splits`` (our split -> source split, or
    null to carve it out of train), ``val_fraction``, ``max_train``/``max_eval`` (seeded random caps).
    """
    source = task.get("source")
    if source == "wordnet_pos":
        data = _wordnet_pos()
    elif source == "hub":
        data = _hub(task)
    elif source == "local":
        data = _local(task)
    else:
        raise ValueError(f"unknown task.source {source!r}; choose hub, local or wordnet_pos")
    return _finish(data, task, seed)


def _wordnet_pos() -> ClassificationData:
    splits = {}
    for s in SPLITS:
        rows = load_wordnet_pos(split=s)
        splits[s] = ([r["text"] for r in rows], [int(r["label"]) for r in rows])
    return ClassificationData(splits, list(POS_LABELS), "wordnet_pos (shipped, outlierlab/datamodules/data/eval)")


def _from_datasets(dd, task: Mapping, what: str) -> ClassificationData:
    text_f, label_f = task.get("text_field", "text"), task.get("label_field", "label")
    split_map = dict(task.get("splits") or {s: s for s in SPLITS})
    splits, names = {}, None
    for ours, theirs in split_map.items():
        if theirs is None or theirs not in dd:
            continue
        ds = dd[theirs]
        missing = {text_f, label_f} - set(ds.column_names)
        if missing:
            raise ValueError(f"{what} split {theirs!r} has no column(s) {sorted(missing)} (columns: "
                             f"{ds.column_names}); set task.text_field / task.label_field")
        feat = ds.features.get(label_f)
        if names is None and getattr(feat, "names", None):
            names = list(feat.names)
        splits[ours] = (list(ds[text_f]), list(ds[label_f]))
    if "train" not in splits:
        raise ValueError(f"{what} has no train split (available: {list(dd)}); set task.splits.train")
    return ClassificationData(splits, names or [], what)


def _hub(task: Mapping) -> ClassificationData:
    path = task["path"]
    dd = load_hub(path, task.get("subset"), advice=(
        f"download it once with network (datasets.load_dataset({path!r})) and rerun, or use task=wordnet_pos "
        "(shipped) or task=local task.files=[train.csv] (text,label columns)"))
    return _from_datasets(dd, task, f"hub dataset {path}")


def _local(task: Mapping) -> ClassificationData:
    files = task.get("files")
    if not files:
        raise ValueError("task=local needs task.files=[data.csv] (columns text,label) or "
                         "task.files={train: a.csv, test: b.csv}")
    by_split = dict(files) if isinstance(files, Mapping) else {"train": list(files) if not isinstance(files, str)
                                                              else [files]}
    by_split = {s: [str(Path(str(f)).expanduser()) for f in ([v] if isinstance(v, str) else v)]
                for s, v in by_split.items()}
    unknown = set(by_split) - set(SPLITS)
    if unknown:
        raise ValueError(f"task.files split names must be train/validation/test, got {sorted(unknown)}")
    existing_files([f for fs in by_split.values() for f in fs], "task")
    builder, kw = file_builder([f for fs in by_split.values() for f in fs], "task")
    dd = datasets.load_dataset(builder, data_files=by_split, **kw)
    return _from_datasets(dd, {**task, "splits": {s: s for s in by_split}}, f"local files ({builder})")


def _finish(data: ClassificationData, task: Mapping, seed: int) -> ClassificationData:
    """Map labels to 0..C-1, replace missing/unlabelled splits, apply the caps."""
    rng = np.random.default_rng(seed)
    splits = {s: (list(map(str, t)), list(y)) for s, (t, y) in data.splits.items()}
    if "test" in splits and all(isinstance(v, (int, np.integer)) and v < 0 for v in splits["test"][1]):
        data.notes.append("test split is unlabelled (labels -1): validation used as test")
        splits["test"] = splits.pop("validation", (None, None))
        if splits["test"][0] is None:
            splits.pop("test")
    frac = float(task.get("val_fraction", 0.1))
    n_orig = len(splits["train"][0])
    for missing in ("test", "validation"):
        if missing not in splits:  # val_fraction of the ORIGINAL train split each
            texts, labels = splits["train"]
            perm = rng.permutation(len(texts))
            n_out = max(1, int(round(frac * n_orig)))
            out, keep = np.sort(perm[:n_out]), np.sort(perm[n_out:])
            splits[missing] = ([texts[i] for i in out], [labels[i] for i in out])
            splits["train"] = ([texts[i] for i in keep], [labels[i] for i in keep])
            data.notes.append(f"{missing} split carved from train ({frac:.0%}, seed {seed})")
    # Labels: ints used as they are; strings mapped in sorted order of the training labels.
    all_labels = [v for s in splits.values() for v in s[1]]
    if all(isinstance(v, (int, np.integer, bool)) for v in all_labels):
        num = max(int(v) for v in all_labels) + 1
        names = data.label_names if len(data.label_names) >= num else [str(i) for i in range(num)]
        mapping = None
    else:
        names = sorted({str(v) for v in splits["train"][1]})
        mapping = {n: i for i, n in enumerate(names)}
        unknown = {str(v) for v in all_labels} - set(mapping)
        if unknown:
            raise ValueError(f"labels {sorted(unknown)[:5]} appear outside the train split")
    caps = {"train": task.get("max_train"), "validation": task.get("max_eval"), "test": task.get("max_eval")}
    out = {}
    for s in SPLITS:
        texts, labels = splits[s]
        labels = [int(v) if mapping is None else mapping[str(v)] for v in labels]
        if any(v < 0 for v in labels):
            raise ValueError(f"split {s} has negative (missing) labels; give a labelled split")
        cap = caps[s]
        if cap is not None and cap < len(texts):  # seeded random subset: hub files are often label-sorted
            idx = np.sort(rng.permutation(len(texts))[:int(cap)])
            texts, labels = [texts[i] for i in idx], [labels[i] for i in idx]
        out[s] = (texts, labels)
    return ClassificationData(out, list(names), data.source, data.notes)
