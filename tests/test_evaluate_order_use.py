"""evaluate.py analyses=[order_use]: the CLI's numbers equal order_use() on the same batches, for a Hugging Face
decoder (GPT-2) and for our own masked run; a model without positions is flagged in the report."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from family_models import build, save
from probe_fixtures import SENTENCES, save_own_run

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def _evaluate(model_dir: Path, texts: Path, out: Path) -> dict[tuple[object, str], float]:
    """``{("model", statistic): value}`` from order_use.csv's one row, ``{(layer, statistic): value}`` (layer an int)
    from order_use_layers.csv."""
    p = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), f"encoder.name_or_path={model_dir}",
                        "analyses=[order_use]", f"order_use.files=[{texts}]", "order_use.batch_size=4", "seed=3",
                        f"hydra.run.dir={out}"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    with open(out / "order_use.csv", newline="") as fh:
        (model,) = list(csv.DictReader(fh))
    with open(out / "order_use_layers.csv", newline="") as fh:
        layers = list(csv.DictReader(fh))
    assert [int(r["layer"]) for r in layers] == list(range(len(layers)))  # integer layers, 0 = embeddings
    rows = {("model", k): float(v) for k, v in model.items() if v != ""}
    rows.update({(int(r["layer"]), k): float(v) for r in layers for k, v in r.items() if k != "layer" and v != ""})
    return rows


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    path = tmp_path_factory.mktemp("order_texts") / "texts.txt"
    path.write_text("\n".join(f"{a} and then {b}" for a in SENTENCES for b in SENTENCES[:3]) + "\n")
    return path


@pytest.mark.slow
def test_a_decoder_from_the_hub_format(tmp_path, texts):
    from outlierlab.metrics.word_order import order_use
    from outlierlab.evaluation.analyses.attention_sinks import text_batches

    model, tok = build("gpt2", seed=0)
    rows = _evaluate(save(model, tok, tmp_path / "gpt2"), texts, tmp_path / "out")
    lines = texts.read_text().splitlines()
    batches = [{"input_ids": ids, "attention_mask": m, "labels": ids.masked_fill(m == 0, -100)}
               for ids, m in text_batches(tok, lines, 128, 4)]

    def loss_sum(b):
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        labels = b["labels"][:, 1:]
        keep = labels != -100
        return torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum"), int(keep.sum())

    special = [i for i in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.cls_token_id, tok.sep_token_id)
               if i is not None]
    with torch.inference_mode():
        expected = order_use(loss_sum, batches, special, seed=3)
    assert rows[("model", "order_use")] == pytest.approx(expected["order_use"], abs=1e-4)
    assert rows[("model", "tokens")] == expected["tokens"]
    assert 0 < rows[("model", "attn_local_uniform")] < 1 and (2, "attn_local") in rows and (0, "attn_local") not in rows
    # the causal mask is an order signal: every block's mean-pooled vector moves when the tokens are shuffled
    assert all(rows[(i, "pooled_order_change")] > 1e-6 for i in (1, 2))


def test_our_masked_run_without_positions_is_flagged(tmp_path, texts):
    save_own_run(tmp_path / "run", pos="none", layers=2, hidden=32)
    rows = _evaluate(tmp_path / "run", texts, tmp_path / "out")
    assert abs(rows[("model", "order_use")]) < 1e-5  # permutation-equivariant
    # ... and so are its vectors: each text's mean-pooled vector is the same in any order, at every layer
    change = [rows[(i, "pooled_order_change")] for i in range(3)]
    assert max(abs(c) for c in change) < 1e-6 and rows[("model", "pooled_order_change_texts")] > 10
    assert rows[("model", "tokens")] > 50
    # a masked model without positions cannot use order (not "yet"): known from its export's config
    report = (tmp_path / "out" / "report.md").read_text()
    assert "The model cannot use token order: a masked LM without positions" in report
    # no table of this run compares transforms: the header names none, nor a whitening fit
    assert "transforms side by side" not in report and "fit_on" not in report


def test_only_masked_models_of_ours_without_positions_are_orderless():
    from types import SimpleNamespace

    from outlierlab.evaluation.analyses.order_use import orderless

    def loaded(config, decoder=False):
        return SimpleNamespace(model=SimpleNamespace(config=config), is_decoder=decoder)

    assert orderless(loaded(SimpleNamespace(outlierlab_pos="none")))  # our HF export (config.json)
    assert orderless(loaded(SimpleNamespace(pos={"name": "none"})))  # our own format
    assert not orderless(loaded(SimpleNamespace(outlierlab_pos="learned")))
    assert not orderless(loaded(SimpleNamespace(pos={"name": "none"}), decoder=True))  # the causal mask is order
    assert not orderless(loaded(SimpleNamespace(model_type="bert")))  # anyone else's model: not known to be


def test_texts_with_nothing_to_shuffle_leave_the_rest_of_the_section(tmp_path):
    """One-word texts (MiniLM: no LM head) have no order to change: the section says so in one line and keeps the
    attention locality, instead of failing the whole evaluate run."""
    import outlierlab as ol

    enc = ol.load_encoder("all-minilm-l6-v2", device="cpu")
    tables = ol.evaluate(enc, ["Anne", "sea", "Bath"], analyses=["order_use"], out_dir=tmp_path, progress=False)
    model, layers = tables["order_use"].iloc[0], tables["order_use_layers"]
    assert model["pooled_order_change_texts"] == 0 and model["attn_local_uniform"] == 1  # 3 tokens: all within 2
    assert layers["layer"].tolist() == list(range(7)) and layers["pooled_order_change"].isna().all()
    assert layers["attn_local"].notna().tolist() == [False] + [True] * 6
    report = (tmp_path / "report.md").read_text()
    assert "Sentence vectors not compared: the sentence-vector order change needs at least one text with two" in report


@pytest.mark.slow
def test_probe_py_reports_the_order_use_evaluate_py_measures(tmp_path):
    """The position probe's order-use section (probe.py ``probe.order_use=true``, the default) is evaluate.py's
    ``order_use`` on the same sentences and seed: the same rows, on the shipped MiniLM (no LM head: its attention
    locality and sentence-vector order change)."""
    import pandas as pd

    import outlierlab as ol
    from outlierlab.datamodules.eval_data import load_sentences

    texts = list(load_sentences()[:60])
    enc = ol.load_encoder("all-minilm-l6-v2", device="cpu")
    evaluated = ol.evaluate(enc, texts, analyses=["order_use"], transforms=["none"], seed=3, progress=False)
    ol.probe_positions(enc, texts, seed=3, out_dir=tmp_path / "probe", overrides=["probe.epochs=1"], progress=False)
    for name in ("order_use", "order_use_layers"):
        probed = pd.read_csv(tmp_path / "probe" / f"{name}.csv")
        pd.testing.assert_frame_equal(probed, evaluated[name].reset_index(drop=True), check_dtype=False)
    assert probed["layer"].tolist() == list(range(7)) and probed["attn_local"].notna().sum() == 6
    report = (tmp_path / "probe" / "probe_report.md").read_text()
    assert "## Order use: does the model use word order?" in report and "has no LM head" in report
