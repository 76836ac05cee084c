"""The hub paths, exercised offline: local stand-ins in the real formats take the code path a hub
name takes.

* Encoders: small random BERT, RoBERTa and DistilBERT saved with ``save_pretrained`` into a Hugging Face hub
  cache laid out as the hub client writes it (``models--<id>/refs/main`` + ``snapshots/<sha>/``); the loader
  gets the plain hub id and resolves it through ``_resolve_hub`` and ``from_pretrained(local_files_only=True)``,
  exactly as a cached ``roberta-base``.
* Data sets: parquet files written with ``datasets`` in each hub data set's column layout and features
  (ClassLabel names included); ``datasets.load_dataset`` is wrapped so that the hub ids load those files, and
  every call is recorded, so the tests assert the hub branch was taken, not only the result.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch
import transformers

from tests.conftest import compose
from tests.probe_fixtures import SENTENCES, minilm_path, save_tiny_bert, save_tiny_roberta

SHA = "0123456789abcdef0123456789abcdef01234567"
ENCODERS = ("roberta-base", "bert-base-uncased", "distilbert-base-uncased")


def _save_tiny_distilbert(directory: Path) -> Path:
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(minilm_path())
    DistilBertModel(DistilBertConfig(vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                     max_position_embeddings=64)).eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """A hub cache holding the three stand-in encoders under their real hub ids."""
    cache = tmp_path_factory.mktemp("hf_hub_cache")
    for repo, save in zip(ENCODERS, (save_tiny_roberta, save_tiny_bert, _save_tiny_distilbert)):
        repo_dir = cache / f"models--{repo}"
        save(repo_dir / "snapshots" / SHA)
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / "main").write_text(SHA)
    return cache


def _label(names):
    return datasets.ClassLabel(names=names)


def _table(columns: dict, features: dict | None = None) -> datasets.Dataset:
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features) if features else None)


def _stand_in_tables() -> dict[tuple[str, str | None], dict[str, datasets.Dataset]]:
    """(hub id, config) -> split -> rows, with the hub's column names and features."""
    n = len(SENTENCES)
    sst2 = {s: _table({"idx": list(range(n)), "sentence": SENTENCES, "label": [i % 2 for i in range(n)]},
                      {"idx": datasets.Value("int32"), "sentence": datasets.Value("string"),
                       "label": _label(["negative", "positive"])}) for s in ("train", "validation", "test")}
    sst5_names = ["very negative", "negative", "neutral", "positive", "very positive"]
    sst5 = {s: _table({"text": SENTENCES, "label": [i % 5 for i in range(n)],
                       "label_text": [sst5_names[i % 5] for i in range(n)]}) for s in ("train", "validation", "test")}
    imdb = {s: _table({"text": SENTENCES * 2, "label": [i % 2 for i in range(2 * n)]},
                      {"text": datasets.Value("string"), "label": _label(["neg", "pos"])})
            for s in ("train", "test", "unsupervised")}
    wic_rows = {"word": ["sea", "word"], "sentence1": ["the sea was calm", "in the beginning was the word"],
                "sentence2": ["he sailed the sea", "a stitch in time is a word"], "start1": [4, 25],
                "start2": [13, 22], "end1": [7, 29], "end2": [16, 26], "idx": [0, 1], "label": [1, 0]}
    wic_features = {k: datasets.Value("string") for k in ("word", "sentence1", "sentence2")} | {
        k: datasets.Value("int32") for k in ("start1", "start2", "end1", "end2", "idx")} | {
        "label": _label(["False", "True"])}
    wic = {s: _table(wic_rows, wic_features) for s in ("train", "validation", "test")}
    sts_rows = {"sentence1": SENTENCES[:6], "sentence2": SENTENCES[2:8], "score": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]}
    stsb = {s: _table(dict(sts_rows, score=[x / 5 for x in sts_rows["score"]])) for s in ("train", "validation", "test")}
    sick = {"test": _table(sts_rows)}
    wiki = {"train": _table({"id": [str(i) for i in range(n)], "url": [f"https://en.wikipedia.org/wiki?curid={i}"
                                                                        for i in range(n)],
                             "title": [f"T{i}" for i in range(n)], "text": SENTENCES})}
    return {("stanfordnlp/sst2", None): sst2, ("SetFit/sst5", None): sst5, ("stanfordnlp/imdb", None): imdb,
            ("aps/super_glue", "wic"): wic, ("sentence-transformers/stsb", None): stsb,
            ("mteb/sickr-sts", None): sick, ("wikimedia/wikipedia", "20231101.en"): wiki}


@pytest.fixture(scope="module")
def hub_data(tmp_path_factory) -> dict:
    """Each stand-in written as one parquet file per split (the hub's ``data/<split>-00000-of-00001.parquet``)."""
    root = tmp_path_factory.mktemp("hub_datasets")
    files = {}
    for (repo, name), splits in _stand_in_tables().items():
        d = root / repo / (name or "default")
        d.mkdir(parents=True)
        files[(repo, name)] = {}
        for split, table in splits.items():
            path = d / f"{split}-00000-of-00001.parquet"
            table.to_parquet(str(path))
            files[(repo, name)][split] = str(path)
    return files


@pytest.fixture
def hub(monkeypatch, hub_cache, hub_data):
    """Point the hub client at the stand-in cache and hub data set ids at the stand-in files; record calls."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    calls = {"datasets": [], "models": []}
    real_load = datasets.load_dataset

    def load_dataset(path, name=None, *args, split=None, streaming=False, **kw):
        key = (path, name)
        if key not in hub_data:
            return real_load(path, name, *args, split=split, streaming=streaming, **kw)
        calls["datasets"].append({"path": path, "name": name, "split": split, "streaming": streaming})
        return real_load("parquet", data_files=hub_data[key], split=split, streaming=streaming)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    real_model = transformers.AutoModel.from_pretrained.__func__

    def from_pretrained(cls, name, *args, **kw):
        calls["models"].append({"name": str(name), "local_files_only": kw.get("local_files_only")})
        return real_model(cls, name, *args, **kw)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", classmethod(from_pretrained))
    return calls


@pytest.mark.parametrize("repo", ENCODERS)
def test_hub_id_encoders_load_through_the_hub_branch(hub, hub_cache, repo):
    from safetensors.torch import load_file

    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder(repo, max_length=32)
    assert (enc.source.kind, enc.source.model, enc.source.local_files_only) == ("hf", repo, True)
    assert enc.identity["hub"] == repo  # the hub branch of resolve_encoder, not a local directory
    batch = next(enc.encode(SENTENCES[:2]))
    assert hub["models"] == [{"name": repo, "local_files_only": True}]
    assert batch.hidden.shape[:2] == (enc.num_layers + 1, 2) and torch.isfinite(batch.hidden).all()
    # the weights are the stand-in's: its first saved tensor equals the loaded one
    saved = load_file(str(hub_cache / f"models--{repo}" / "snapshots" / SHA / "model.safetensors"))
    name = next(k for k in saved if "word_embeddings" in k)
    loaded = dict(enc.model.named_parameters())
    key = next(k for k in loaded if k.endswith(name.split(".", 1)[1]) or k == name)
    assert torch.equal(loaded[key].cpu(), saved[name])


@pytest.mark.parametrize("task, labels", [("sst2", ["negative", "positive"]), ("sst5", ["0", "1", "2", "3", "4"]), ("imdb", ["neg", "pos"])])
def test_probe_tasks_load_the_hub_layout(hub, task, labels):
    from outlierlab.datamodules.probe_data import load_classification

    cfg = compose("probe", [f"task={task}"])
    data = load_classification(cfg.task, seed=0)
    path = cfg.task.path
    assert hub["datasets"] == [{"path": path, "name": None, "split": None, "streaming": False}]
    assert data.label_names == labels  # ClassLabel names survive parquet, as from the hub
    n_train = sum(len(data.splits[s][0]) for s in data.splits if s != "test")  # imdb: validation carved from train
    assert n_train == 2 * len(SENTENCES)  # sst: train + validation splits; imdb: its train split (2 x) carved
    assert set(data.splits["test"][0]) <= set(SENTENCES)


def test_superglue_wic_and_sts_load_the_hub_layout(hub):
    from outlierlab.datamodules.pair_sets import STS_HUB, load_sts_pairs
    from outlierlab.configuration.analysis_settings import WicSettings
    from outlierlab.configuration.settings_store import section_settings
    from outlierlab.evaluation.analyses.wic import load_pairs as load_wic_pairs

    pairs, _ = load_wic_pairs(section_settings(WicSettings, compose("evaluate", ["wic=superglue"])), split="validation")
    assert hub["datasets"][-1] == {"path": "aps/super_glue", "name": "wic", "split": "validation",
                                   "streaming": False}
    assert [(p["sentence1"][p["start1"]:p["end1"]], p["label"]) for p in pairs] == [("sea", 1), ("word", 0)]
    for name, expected_top in (("stsb", 1.0), ("sickr", 5.0)):
        sts = load_sts_pairs(STS_HUB[name], "test")
        assert hub["datasets"][-1]["path"] == STS_HUB[name]
        assert float(sts.gold.max()) == expected_top and len(sts.gold) == 6


def test_wikipedia_corpus_loads_the_hub_layout(hub):
    from outlierlab.datamodules.corpus import load_hub_texts

    texts = load_hub_texts("wikimedia/wikipedia", "20231101.en", split="train", max_documents=5, streaming=False)
    assert texts == SENTENCES[:5]
    assert hub["datasets"] == [{"path": "wikimedia/wikipedia", "name": "20231101.en", "split": "train",
                                "streaming": False}]


@pytest.mark.slow
def test_probe_job_with_hub_encoder_and_hub_task(hub, tmp_path, monkeypatch):
    """probe.py's job as `python probe.py encoder=bert_base_uncased task=sst2` runs it (Luo et al. §4.4)."""
    from outlierlab.evaluation.probing import run

    monkeypatch.setenv("OUTLIERLAB_CACHE", str(tmp_path / "cache"))
    cfg = compose("probe", ["encoder=bert_base_uncased", "task=sst2", "probe.epochs=1", "progress=false",
                            f"features.cache_dir={tmp_path / 'features'}"])
    out = run(cfg, str(tmp_path / "run"))
    assert {c["name"] for c in hub["models"]} == {"bert-base-uncased"}
    assert [c["path"] for c in hub["datasets"]] == ["stanfordnlp/sst2"]
    assert len(out["rows"]) == 3  # embedding output + 2 layers of the stand-in, transform none
    assert (tmp_path / "run" / "classifier.csv").is_file()


@pytest.mark.slow
def test_evaluate_with_hub_encoder_wic_and_sts(hub, tmp_path):
    """evaluate.py's job as `python evaluate.py encoder=roberta_base wic=superglue sts=paper` runs it."""
    import evaluate

    cfg = compose("evaluate", ["encoder.name_or_path=roberta-base", "analyses=[wic,sts]", "wic=superglue",
                               "sts=paper", "sts.datasets=[stsb,sickr]", "transform=none", "progress=false",
                               "tensorboard=false"])
    res = evaluate.evaluate(cfg, tmp_path / "run")
    assert {c["name"] for c in hub["models"]} == {"roberta-base"}
    paths = [c["path"] for c in hub["datasets"]]
    assert "aps/super_glue" in paths and {"sentence-transformers/stsb", "mteb/sickr-sts"} <= set(paths)
    sts = next(r for r in res["results"] if r.name == "sts")
    assert {row["dataset"] for row in sts.rows} >= {"stsb", "sickr"}
