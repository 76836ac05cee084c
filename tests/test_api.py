"""The Python API (outlierlab.api) gives the command line's numbers: ol.evaluate's tables equal evaluate.py's CSVs,
ol.probe_positions equals probe.py's position_probe.csv, on the shipped MiniLM and the same texts and seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def _texts() -> list[str]:
    from outlierlab.datamodules.eval_data import load_sentences

    return list(load_sentences(None)[1000:1300])  # real sentences: the whitener needs many distinct vectors


TEXTS = _texts()


def _cli(script: str, *args: str) -> None:
    p = subprocess.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]


def _listing(*dirs: Path) -> set[str]:
    return {str(p) for d in dirs for p in d.rglob("*")}


def _fresh_cwd_and_tmpdir(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """An empty working directory and an empty TMPDIR: what a call that writes nothing must leave empty."""
    work, tmp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir(), tmp.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    return work, tmp


@pytest.mark.slow
def test_evaluate_in_memory_writes_nothing_and_its_tables_equal_the_cli_csvs(tmp_path, monkeypatch, capsys):
    """ol.evaluate creates no file or directory (the temporary and the working directories are listed before and
    after); with out_dir it writes the run and names it; either way its tables, side tables included, equal
    evaluate.py's CSVs exactly for the same texts and seed."""
    import outlierlab as ol

    analyses = ["outliers", "anisotropy", "isotropy", "self_similarity"]
    enc = ol.load_encoder("all-minilm-l6-v2", device="cpu")
    enc.tokenize(["warm up"]), enc.model  # noqa: B018 - the tokenizer's and weights' own caches are not the run's
    work, tmp = _fresh_cwd_and_tmpdir(tmp_path, monkeypatch)
    before = _listing(work, tmp)
    tables = ol.evaluate(enc, TEXTS, analyses=analyses, transforms=["none", "clip", "whiten"], seed=1, progress=False)
    assert _listing(work, tmp) == before == set()
    assert "[evaluate]" not in capsys.readouterr().out  # progress=False: quiet, the tables say it all
    assert all("run_dir" not in t.attrs for t in tables.values())
    # each analysis' table, and the side tables the CLI writes beside them
    assert sorted(tables) == ["anisotropy", "anisotropy_contributions", "isotropy", "layernorm", "outliers",
                              "outliers_by_position", "position_rows", "self_similarity"]
    assert set(tables["anisotropy"]["transform"]) == {"none", "clip", "whiten"}
    written = ol.evaluate(enc, TEXTS, analyses=analyses, transforms=["none", "clip", "whiten"], seed=1,
                          out_dir=tmp_path / "api", progress=False)
    assert written["outliers"].attrs["run_dir"] == str(tmp_path / "api")
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    _cli("evaluate.py", f"analyses=[{','.join(analyses)}]", "transform=[none,clip,whiten]", "seed=1",
         f"data.files=[{tmp_path / 'texts.txt'}]", "data.max_sentences=null", "plots=false", "tensorboard=false",
         f"hydra.run.dir={tmp_path / 'cli'}")
    assert sorted(p.stem for p in (tmp_path / "cli").glob("*.csv")) == sorted(tables) == sorted(written)
    for name, table in tables.items():
        assert len(table) > 0, name
        cli = pd.read_csv(tmp_path / "cli" / f"{name}.csv")
        pd.testing.assert_frame_equal(table, cli, check_exact=True, obj=name)
        pd.testing.assert_frame_equal(written[name], cli, check_exact=True, obj=name)
        assert (tmp_path / "api" / f"{name}.csv").read_bytes() == (tmp_path / "cli" / f"{name}.csv").read_bytes()
    # one list separator: every list-valued column holds ";"-separated items, never spaces
    for name, column in (("anisotropy", "rogue_dims"), ("anisotropy", "rogue_share"), ("outliers", "top_dims")):
        values = tables[name][column].dropna().astype(str)
        assert values.str.contains(";").any() and not values.str.contains(" ").any(), (name, column)


def test_an_analysis_defined_in_the_notebook_rides_the_shared_stream(tmp_path):
    """An analysis written in the notebook (an object with consumers/run, no module) gets every layer of the
    run's transforms: clip's given dims are exactly zero in what it sees, the raw vectors' are not."""
    import types

    import torch

    import outlierlab as ol
    from outlierlab.evaluation.registry import AnalysisResult
    from outlierlab.evaluation.sentence_stream import Consumer

    class DimMass(Consumer):
        def __init__(self, transform, num_layers):
            self.transform, self.n = transform, [0] * num_layers
            self.mass = torch.zeros(num_layers, dtype=torch.float64)

        def update(self, layer, vectors, batch):
            self.mass[layer] += float(vectors[0, :, :2].double().abs().sum())
            self.n[layer] += vectors.shape[1]

    def run(ctx):
        return AnalysisResult("dim_mass", [{"layer": i, "transform": c.transform, "mass": float(c.mass[i]),
                                            "tokens": c.n[i]} for c in ctx.consumers for i in range(len(c.n))],
                              "## Mass of dims 0 and 1\n")

    toy = types.SimpleNamespace(NAME="dim_mass", run=run,
                                consumers=lambda ctx: [DimMass(t, ctx.encoder.num_layers + 1) for t in ctx.transforms])
    enc = ol.load_encoder("all-minilm-l6-v2", device="cpu")
    tables = ol.evaluate(enc, TEXTS[:100], analyses=["outliers", toy], transforms=["none", "clip"],
                         overrides=["transform.dims=[0,1]"], out_dir=tmp_path, progress=False)
    t = tables["dim_mass"]
    assert len(t) == 2 * (enc.num_layers + 1)
    clip, raw = t[t["transform"] == "clip"], t[t["transform"] == "none"]
    assert len(clip) == len(raw) > 0 and (clip["mass"] == 0).all() and (raw["mass"] > 0).all()
    assert t["tokens"].nunique() == 1 and t["tokens"].iloc[0] > 100
    with pytest.raises(ValueError, match="expected a name"):
        ol.evaluate(enc, TEXTS[:100], analyses=[object()], out_dir=tmp_path / "bad", progress=False)


def _probe_csv(path: Path):
    """A CSV probe.py writes, read as ol.probe_positions types it: the columns listing dims as strings, floats as
    written (repr: round trip)."""
    from outlierlab.reports.probe_report import LIST_COLUMNS

    dims = dict.fromkeys(LIST_COLUMNS, str) if path.stem == "position_probe" else None
    return pd.read_csv(path, dtype=dims, float_precision="round_trip")


@pytest.mark.slow
def test_probe_positions_runs_in_memory_writes_nothing_and_equals_probe_py(tmp_path, monkeypatch):
    """On a tiny BERT, ol.probe_positions creates no file or directory (the temporary and working directories are
    listed before and after), and each of its tables equals the CSV probe.py writes for the same texts and seed;
    with out_dir it writes the same files, the same CSVs byte for byte."""
    import outlierlab as ol
    from probe_fixtures import save_tiny_bert

    bert = save_tiny_bert(tmp_path / "bert", layers=2, hidden=32)
    texts = TEXTS[:60]
    few = ["probe.epochs=2", "probe.max_positions=32"]  # order use on: its two tables are compared too
    enc = ol.load_encoder(str(bert), device="cpu")
    enc.tokenize(["warm up"]), enc.model  # noqa: B018 - the tokenizer's and weights' own caches are not the run's
    work, tmp = _fresh_cwd_and_tmpdir(tmp_path, monkeypatch)
    tables = ol.probe_positions(enc, texts, seed=2, overrides=few, progress=False, tables=True)
    assert _listing(work, tmp) == set()
    assert sorted(tables) == ["order_use", "order_use_layers", "position_probe", "position_probe_by_position",
                              "similarity_by_distance"]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    _cli("probe.py", f"encoder.name_or_path={bert}", "seed=2", f"data.files=[{tmp_path / 'texts.txt'}]",
         "data.max_sentences=null", *few, "progress=false", f"features.cache_dir={tmp_path / 'cache'}",
         f"hydra.run.dir={tmp_path / 'cli'}")
    cli = tmp_path / "cli"
    assert sorted(p.stem for p in cli.glob("*.csv")) == sorted(tables)
    for name, table in tables.items():
        assert len(table) > 0, name
        pd.testing.assert_frame_equal(table, _probe_csv(cli / f"{name}.csv"), check_exact=True, obj=name)
    assert len(tables["position_probe"]) == 3 and tables["position_probe"]["top_neurons"].str.count(";").eq(4).all()

    table = ol.probe_positions(enc, texts, seed=2, overrides=few, progress=False, out_dir=tmp_path / "api")
    pd.testing.assert_frame_equal(table, tables["position_probe"], check_exact=True)
    api = tmp_path / "api"
    assert table.attrs["run_dir"] == str(api) and "run_dir" not in tables["position_probe"].attrs
    written = {p.name for p in api.iterdir()}
    assert written == {p.name for p in cli.iterdir()} - {".hydra", "probe.log"}
    assert {"probe_info.json", "probe_report.md", "tensorboard", "position_probe_accuracy.png"} <= written
    for csv in cli.glob("*.csv"):
        assert (api / csv.name).read_bytes() == csv.read_bytes(), csv.name
    # the same settings as a typed section: the same table
    typed = ol.probe_positions(enc, texts, seed=2, progress=False,
                               settings=[ol.ProbeSettings(epochs=2, max_positions=32)])
    pd.testing.assert_frame_equal(typed, tables["position_probe"], check_exact=True)


def test_empty_texts_are_refused_in_one_line(tmp_path):
    import outlierlab as ol
    from outlierlab.api import check_texts

    with pytest.raises(ValueError, match="2 empty or blank item"):
        check_texts(["", "  "])
    assert callable(ol.evaluate) and callable(ol.probe_positions)


def test_a_skipped_analysis_is_an_empty_table_that_says_why_and_dir_lists_the_api(tmp_path):
    """MiniLM (a body without its LM head) cannot be scored for the outlier ablation's loss: evaluate.py writes a
    'Skipped' section; the API returns an empty table, the reason in ``attrs``, instead of a pandas error.  Its order
    use is still measured on its vectors (no skip).  And the lazily loaded API shows in ``dir(ol)`` (a notebook's
    tab completion)."""
    import outlierlab as ol

    assert {"load_encoder", "evaluate", "probe_positions", "OutlierMonitor", "Consumer", "AnalysisResult"} <= set(dir(ol))
    from outlierlab.evaluation.registry import AnalysisResult
    from outlierlab.evaluation.sentence_stream import Consumer, LayerStream

    assert (ol.Consumer, ol.LayerStream, ol.AnalysisResult) == (Consumer, LayerStream, AnalysisResult)
    enc = ol.load_encoder("all-minilm-l6-v2", device="cpu")
    tables = ol.evaluate(enc, TEXTS[:50], analyses=["ablation", "order_use"], out_dir=tmp_path, progress=False)
    table = tables["ablation"]
    assert table.empty and "no masked-LM head" in table.attrs["skipped"] and table.attrs["run_dir"] == str(tmp_path)
    assert "skipped" not in tables["order_use"].attrs
    layers = tables["order_use_layers"]
    assert layers["layer"].tolist() == list(range(7))  # MiniLM: 6 layers + embeddings, integers as in every table
    change = layers["pooled_order_change"].tolist()
    assert all(0 <= c < 1 for c in change) and change[0] < 0.01 < change[6]  # the LayerNorm floor, then order
    model = tables["order_use"].iloc[0]  # one row: no LM head, so no order use in nats
    assert model["pooled_order_change_texts"] == 50 and pd.isna(model["order_use"])
    assert layers["attn_local"].isna().tolist() == [True] + [False] * 6  # no attention at the embedding output


def test_a_callers_own_hydra_context_survives_an_api_call(tmp_path):
    """A researcher's script inside its own Hydra context calls the API between two of its composes: Hydra's one
    global state is set aside while the API composes configs/evaluate.yaml and is put back after (clearing it,
    as the API did, left the script's next compose failing with 'GlobalHydra is not initialized')."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from outlierlab.api import _compose

    (tmp_path / "mine.yaml").write_text("lr: 0.1\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        assert compose("mine").lr == 0.1
        cfg = _compose("evaluate", ["seed=3", "analyses=[outliers]"])
        assert cfg.seed == 3 and list(cfg.analyses) == ["outliers"]
        assert compose("mine", overrides=["lr=0.2"]).lr == 0.2  # still the script's config directory
    assert not GlobalHydra.instance().is_initialized()  # and outside any context, none is left behind
    assert _compose("evaluate", []).seed == 0 and not GlobalHydra.instance().is_initialized()


def test_an_install_without_the_configs_is_told_what_to_do(tmp_path, monkeypatch):
    """An install whose configs are missing (a wheel built from an sdist without them): one line naming the missing
    file and the fix."""
    import outlierlab.configuration.overrides as overrides
    from outlierlab.api import _compose

    monkeypatch.setattr(overrides, "CONFIG_DIR", tmp_path / "configs")
    with pytest.raises(FileNotFoundError, match=r"configs/evaluate\.yaml not found.*pip install -e \.") as e:
        _compose("evaluate", [])
    assert "\n" not in str(e.value)


def test_a_model_in_memory_gives_the_numbers_of_the_same_model_saved(tmp_path, monkeypatch):
    """ol.load_encoder(model, tokenizer=tok) -- a transformers model in the notebook -- and a SentenceTransformer
    around the same body give the tables of that model saved to a directory and loaded from it; the model is used
    as it is: the same object, nothing written, no copy of its weights."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer
    from transformers import RobertaModel

    import outlierlab as ol
    from tests.loop_monitor_helpers import bpe_tokenizer, perturb_layernorms, tiny_roberta

    tok = bpe_tokenizer(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], roberta=True)
    torch.manual_seed(0)
    body = RobertaModel(tiny_roberta(tok).config)
    perturb_layernorms(body)
    body.save_pretrained(tmp_path / "saved")
    tok.save_pretrained(tmp_path / "saved")
    st = SentenceTransformer(modules=[Transformer(str(tmp_path / "saved"), max_seq_length=32), Pooling(32, "mean")],
                             device="cpu")

    def tables(model, **kw):
        enc = ol.load_encoder(model, device="cpu", max_length=32, **kw)
        return ol.evaluate(enc, TEXTS[:120], analyses=["outliers", "anisotropy"], transforms=["none", "whiten"],
                           seed=1, progress=False)

    saved = tables(str(tmp_path / "saved"))
    for name, given in {"in memory": tables(body, tokenizer=tok), "SentenceTransformer": tables(st)}.items():
        assert sorted(given) == sorted(saved) and {"anisotropy", "outliers", "layernorm"} <= set(saved), name
        for analysis in saved:
            pd.testing.assert_frame_equal(given[analysis], saved[analysis], obj=f"{name}: {analysis}")
    work, tmp = _fresh_cwd_and_tmpdir(tmp_path, monkeypatch)
    body.train()
    enc = ol.load_encoder(body, tokenizer=tok, device="cpu")
    ol.evaluate(enc, TEXTS[:20], analyses=["outliers"], transforms=["none"], progress=False)
    assert enc.model is body and not body.training  # the object itself, in eval mode
    assert _listing(work, tmp) == set()  # no snapshot saved anywhere
    with torch.no_grad():  # read live: a change to the weights shows at the next call
        body.encoder.layer[0].output.LayerNorm.bias[3] += 50.0
    moved = ol.evaluate(enc, TEXTS[:20], analyses=["outliers"], transforms=["none"], progress=False)["outliers"]
    assert moved.loc[moved["layer"] == 1, "argmax_dim"].item() == 3
    half = RobertaModel(body.config).to(torch.bfloat16)
    assert ol.load_encoder(half, tokenizer=tok).model.dtype == torch.bfloat16  # its own dtype, not float32
    with pytest.raises(TypeError, match="device_map apply to a model that is loaded"):
        ol.load_encoder(body, tokenizer=tok, device_map="auto")
    with pytest.raises(TypeError, match="pass tokenizer="):
        ol.load_encoder(body)
    with pytest.raises(TypeError, match="cannot load a Linear from memory"):
        ol.load_encoder(torch.nn.Linear(2, 2), tokenizer=tok)
    with pytest.raises(TypeError, match="brings its own tokenizer"):
        ol.load_encoder(str(tmp_path / "saved"), tokenizer=tok)
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(RobertaModel.from_pretrained(tmp_path / "saved"), LoraConfig(r=2, target_modules=["query"]))
    with pytest.raises(TypeError, match="merge_and_unload"):
        ol.load_encoder(lora, tokenizer=tok)
    merged = tables(lora.merge_and_unload(), tokenizer=tok)  # B = 0: the merged model is the saved one
    for analysis in saved:
        pd.testing.assert_frame_equal(merged[analysis], saved[analysis], obj=f"merged LoRA: {analysis}")


def test_typed_settings_replace_their_sections_and_equal_the_same_overrides():
    """settings=[AnisotropySettings(n_sentences=40), OutliersSettings(threshold=0.5)] gives the tables of the same
    values as override strings, and they take effect (20 pairs; a stricter outlier rule finds no more dims)."""
    import outlierlab as ol

    enc = ol.load_encoder("all-minilm-l6-v2", device="cpu")
    kw = dict(analyses=["outliers", "anisotropy"], transforms=["none"], progress=False)
    typed = ol.evaluate(enc, TEXTS[:60], settings=[ol.AnisotropySettings(n_sentences=40),
                                                   ol.OutliersSettings(threshold=0.5)], **kw)
    strings = ol.evaluate(enc, TEXTS[:60], overrides=["anisotropy.n_sentences=40", "outliers.threshold=0.5"], **kw)
    default = ol.evaluate(enc, TEXTS[:60], **kw)
    for name in ("outliers", "anisotropy"):
        pd.testing.assert_frame_equal(typed[name], strings[name])
    assert set(typed["anisotropy"]["n_pairs"]) == {20} and set(default["anisotropy"]["n_pairs"]) == {30}
    assert (typed["outliers"]["n_outlier_dims"] <= default["outliers"]["n_outlier_dims"]).all()
