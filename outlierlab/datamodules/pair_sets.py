"""The sentence-pair evaluation sets of ``evaluate.py``, from the shipped files, the hub (``datasets``) or local
files: Word-in-Context pairs (Pilehvar & Camacho-Collados 2019; Luo et al. 2021 §4.2) and STS pairs with gold
scores (SentEval; Luo et al. §4.3).  Plain arguments, no config: the analyses pass their settings' values."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from outlierlab.datamodules.dataset_sources import load_hub, load_local
from outlierlab.datamodules.eval_data import load_wic
from outlierlab.datamodules.validation import _FALSE, _TRUE, STS, WIC

__all__ = ["load_wic_pairs", "WIC_FIELDS", "WIC_DEFAULT_SPLIT", "load_sts_pairs", "StsPairs", "STS_HUB", "STS_FIELDS"]


# ------------------------------------------------------------------------------------------------ WiC
WIC_FIELDS = WIC.required
WIC_DEFAULT_SPLIT = {"wordnet": "train", "superglue": "train", "files": None}  # the paper sweeps on WiC's train split


def _label(v) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        if v not in (0, 1):
            raise ValueError(f"WiC label {v!r} is not 0/1 (SuperGLUE's test split is unlabelled: -1)")
        return bool(v)
    s = str(v).strip().lower()
    if s in _TRUE or s in _FALSE:
        return s in _TRUE
    raise ValueError(f"WiC label {v!r} is not true/false, T/F or 0/1")


def _clean(rows, what: str) -> list[dict]:
    out = []
    for r in rows:
        pair = {k: r[k] for k in WIC_FIELDS}
        for k in ("start1", "end1", "start2", "end2"):
            pair[k] = int(pair[k])
        pair["label"] = _label(pair["label"])
        pair["word"] = r.get("word", "")
        out.append(pair)
    if not out:
        raise ValueError(f"{what} holds no WiC pairs")
    return out


def load_wic_pairs(source: str, split: str | None = None, files=None, hub_path: str = "aps/super_glue",
                   hub_name: str | None = "wic", max_pairs: int | None = None) -> tuple[list[dict], str]:
    """WiC pairs of ``split`` (None: the source's default, ``WIC_DEFAULT_SPLIT``) and a description:
    ``source`` ``wordnet`` (the shipped set), ``superglue`` (``hub_path``/``hub_name`` through ``datasets``), or
    ``files`` (local jsonl/csv/tsv; given files win over ``source``); the first ``max_pairs`` only."""
    source = "files" if files else source
    split = split if split is not None else WIC_DEFAULT_SPLIT.get(source)
    if source == "wordnet":
        rows, what = load_wic(split=split), f"shipped WordNet WiC-style pairs, split {split}"
    elif source == "superglue":
        rows = load_hub(hub_path, hub_name, split or "validation",
                        "use the shipped set (wic.source=wordnet) or local files (wic.files=[pairs.jsonl])")
        what = f"SuperGLUE WiC ({hub_path}/{hub_name}), split {split}"
    elif source == "files":
        ds = load_local(list(files), WIC_FIELDS, "wic")
        rows = [r for r in ds if split is None or "split" not in ds.column_names or r["split"] == split]
        what = f"local files {list(files)}" + (
            f", split {split}" if split and "split" in ds.column_names else "")
    else:
        raise ValueError(f"wic source {source!r}: choose wordnet, superglue, or give files")
    pairs = _clean(rows, what)
    if max_pairs is not None and max_pairs < len(pairs):  # first N: the shipped/hub files are not label-sorted
        pairs = pairs[:max_pairs]
    return pairs, what


# ------------------------------------------------------------------------------------------------ STS
#: Short names → hub ids (all with columns sentence1, sentence2, score).  STS-B scores are in [0, 1],
#: the others in [0, 5]; Spearman does not care.
STS_HUB = {"stsb": "sentence-transformers/stsb", "sickr": "mteb/sickr-sts", "sts12": "mteb/sts12-sts",
           "sts13": "mteb/sts13-sts", "sts14": "mteb/sts14-sts", "sts15": "mteb/sts15-sts", "sts16": "mteb/sts16-sts"}
STS_FIELDS = STS.required
STS_ADVICE = "pass local pairs instead: sts.files=[pairs.csv] (columns sentence1, sentence2, score)"

@dataclass
class StsPairs:
    """One STS data set: sentence pairs, gold scores, optional sub-set label per pair, description."""

    s1: list[str]
    s2: list[str]
    gold: torch.Tensor
    subsets: list[str] | None
    what: str
    local: bool


def load_sts_pairs(source, split: str, cap=None, subset_field: str | None = None) -> StsPairs:
    """The pairs of one data set split (``source``: a hub id or ``[file]``)."""
    if isinstance(source, list):
        ds, what = load_local(source, STS_FIELDS, "sts"), f"local file {source[0]}"
    else:
        ds, what = load_hub(source, None, split, STS_ADVICE), f"{source} ({split})"
        missing = [c for c in STS_FIELDS if c not in ds.column_names]
        if missing:
            raise ValueError(f"STS dataset {source} lacks column(s) {missing} (columns: {ds.column_names})")
    s1, s2 = [str(x) for x in ds["sentence1"]], [str(x) for x in ds["sentence2"]]
    gold = torch.tensor([float(x) for x in ds["score"]], dtype=torch.float64)
    subsets = ([str(x) for x in ds[subset_field]] if subset_field and subset_field in ds.column_names else None)
    if cap is not None and int(cap) < len(s1):
        s1, s2, gold = s1[:int(cap)], s2[:int(cap)], gold[:int(cap)]
        subsets = None if subsets is None else subsets[:int(cap)]
    if len(s1) < 2:
        raise ValueError(f"STS dataset {what} has fewer than 2 pairs")
    return StsPairs(s1, s2, gold, subsets, what, isinstance(source, list))
