"""``python evaluate.py`` end to end on a locally saved tiny model, and its one-line failures."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from probe_fixtures import SENTENCES, save_own_run
from tests.evaluate_fixtures import COLUMNS

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT),
       "TOKENIZERS_PARALLELISM": "false"}
N_HIDDEN_STATES = 3  # embeddings + 2 layers


def _evaluate(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def _read(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as fh:
        r = csv.DictReader(fh)
        return list(r.fieldnames or []), list(r)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval_inputs")
    save_own_run(d / "run", pos="learned", layers=N_HIDDEN_STATES - 1, hidden=32)
    texts = [f"{s} and then {t}" for s in SENTENCES for t in SENTENCES[:4]]  # 32 sentences, words repeat
    (d / "sentences.txt").write_text("\n".join(texts) + "\n")
    pairs = []
    for i, (a, b) in enumerate(zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1])):
        w = "the" if "the " in a and "the " in b else a.split()[0]
        if w not in b.split():
            b = f"{w} {b}"
        pairs.append({"word": w, "sentence1": a, "sentence2": b, "start1": a.index(w), "end1": a.index(w) + len(w),
                      "start2": b.index(w), "end2": b.index(w) + len(w), "label": i % 2 == 0})
    (d / "wic.jsonl").write_text("\n".join(json.dumps(p) for p in pairs) + "\n")
    with open(d / "sts.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sentence1", "sentence2", "score"])
        for i, (a, b) in enumerate(zip(SENTENCES, SENTENCES[3:] + SENTENCES[:3])):
            w.writerow([a, b if i % 3 else a, float(i % 5)])
    return d


def _full_args(inputs: Path) -> list[str]:
    return [f"encoder.name_or_path={inputs / 'run'}", f"data.files=[{inputs / 'sentences.txt'}]",
            f"wic.files=[{inputs / 'wic.jsonl'}]", f"sts.files=[{inputs / 'sts.csv'}]",
            "self_similarity.min_sentences=3", "progress=false", "seed=3",
            "transform.allow_degenerate=true"]  # 8 STS pairs cannot support a 32-dim whitening


@pytest.fixture(scope="module")
def full_run(inputs, tmp_path_factory) -> Path:
    """Every default analysis (and STS) on the tiny model, with figures and TensorBoard."""
    out = tmp_path_factory.mktemp("full") / "run"
    p = _evaluate(*_full_args(inputs), f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_end_to_end_writes_every_report_file(full_run):
    out = full_run
    for name, cols in COLUMNS.items():
        header, rows = _read(out / name)
        assert header == cols, name
        per_transform = {(r["transform"], r.get("dataset", "")) for r in rows}
        assert {t for t, _ in per_transform} == {"none", "clip", "whiten"}, name
        for key in per_transform:  # one row per hidden state (layer 0 = embeddings) for every transform
            assert sorted(int(r["layer"]) for r in rows if (r["transform"], r.get("dataset", "")) == key) \
                == list(range(N_HIDDEN_STATES)), (name, key)
    # every analysis' numbers are also in results.json; the report names the whitening fit
    res = json.loads((out / "results.json").read_text())
    assert set(res["analyses"]) == {"outliers", "anisotropy", "isotropy", "self_similarity", "wic", "sts"}
    assert res["meta"]["seed"] == 3 and res["meta"]["layers"] == N_HIDDEN_STATES
    assert len(res["analyses"]["wic"]["rows"]) == 3 * N_HIDDEN_STATES
    report = (out / "report.md").read_text()
    for heading in ("## Outlier dimensions", "## Anisotropy", "### Rogue dimensions", "## Isotropy",
                    "## Geometry per layer and transform (Table 1 layout)", "## Self-similarity", "## Word in Context",
                    "## Semantic Textual Similarity", "### Position embeddings", "### LayerNorm weights",
                    "whitening fit (`transform.fit_on=eval`)", "all-true baseline", "surface-form baseline",
                    "transforms side by side: none, clip, whiten"):
        assert heading in report, heading
    # our learned-position model has a position table and post-LN LayerNorms (emb + 2 per layer)
    assert "roberta.embeddings.position_embeddings.weight" in report
    ln_header, ln_rows = _read(out / "layernorm.csv")
    assert len(ln_rows) >= 1 + 2 * (N_HIDDEN_STATES - 1) and "gain_outlier_dims" in ln_header
    for png in ("anisotropy.png", "self_similarity.png", "outliers_mean_vectors.png", "position_mean_vector.png",
                "wic.png", "sts.png"):
        assert (out / png).stat().st_size > 1000, png
    # the report links exactly the figures results.json lists, and each was drawn
    linked = set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report))
    listed = {f for a in res["analyses"].values() for f in a["figures"]}
    assert linked == listed and "position_rows.png" in linked
    assert all((out / f).stat().st_size > 1000 for f in linked)
    # TensorBoard: eval/<analysis>/<transform> as a table, a row per layer -- no scalar series whose steps are
    # layers (TensorBoard would smooth it on its training-step axis, among the training runs' curves)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    ea = EventAccumulator(str(out / "tensorboard")).Reload()
    assert not ea.Tags()["scalars"]
    tags = {t.removesuffix("/text_summary") for t in ea.Tags()["tensors"]}
    assert {"eval/anisotropy/whiten", "eval/wic/clip", "eval/sts/none/sts.csv"} <= tags
    table = tensor_util.make_ndarray(ea.Tensors("eval/anisotropy/none/text_summary")[0].tensor_proto).item().decode()
    lines = table.splitlines()
    assert lines[0].startswith("| layer | anisotropy |") and len(lines) == 2 + N_HIDDEN_STATES
    _, sts_rows = _read(out / "sts.csv")
    assert all(-1.0 <= float(r["spearman"]) <= 1.0 for r in sts_rows)


@pytest.mark.slow
def test_plots_false_writes_the_same_numbers_and_no_figure(inputs, full_run, tmp_path):
    """``plots=false`` (a checkpoint series, a sweep): the same CSVs byte for byte, no PNG, a report that links
    none and a results.json that lists none."""
    out = tmp_path / "run"
    p = _evaluate(*_full_args(inputs), f"hydra.run.dir={out}", "plots=false")
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(f.name for f in full_run.glob("*.png"))  # the reference drew them
    assert not list(out.glob("*.png"))
    for name in [*COLUMNS, "position_rows.csv", "outliers_by_position.csv", "anisotropy_contributions.csv",
                 "layernorm.csv"]:
        assert (out / name).read_bytes() == (full_run / name).read_bytes(), name
    report = (out / "report.md").read_text()
    assert "![" not in report and "## Anisotropy" in report and "### Position embeddings" in report
    res = json.loads((out / "results.json").read_text())
    assert all(a["figures"] == [] for a in res["analyses"].values())


def test_plots_must_be_a_boolean(tmp_path):
    p = _evaluate("plots=maybe", f"hydra.run.dir={tmp_path}", timeout=60)
    assert p.returncode == 2  # refused with the other override errors, before the job starts
    lines = p.stderr.strip().splitlines()
    assert lines == ["error: plots must be true or false, got 'maybe'"]


def test_unknown_analysis_fails_with_one_line(tmp_path):
    p = _evaluate("analyses=[outliers,nope]", f"hydra.run.dir={tmp_path}", timeout=60)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith("error: unknown analysis 'nope'; valid: outliers, anisotropy, isotropy, "
                               "self_similarity, wic, sts, ablation, frequency, attention_sinks")
    assert len(lines) == 1


def test_unknown_transform_group_fails_before_hydra(tmp_path):
    p = _evaluate("transform=[none,blur]", f"hydra.run.dir={tmp_path}", timeout=60)
    assert p.returncode == 2 and "unknown transform 'blur'" in p.stderr


def test_offline_hub_datasets_fail_fast_with_the_message(compose_cfg):
    from outlierlab.datamodules.pair_sets import load_sts_pairs
    from outlierlab.configuration.analysis_settings import WicSettings
    from outlierlab.configuration.settings_store import section_settings
    from outlierlab.evaluation.analyses.wic import load_pairs as wic_pairs

    with pytest.raises(ConnectionError, match=r"cannot load hub dataset 'mteb/sts12-sts' split 'test'.*offline.*"
                                              r"sts\.files=\[pairs\.csv\]"):
        load_sts_pairs("mteb/sts12-sts", "test")
    with pytest.raises(ConnectionError, match=r"'aps/super_glue \(wic\)'.*offline.*wic\.source=wordnet"):
        wic_pairs(section_settings(WicSettings, compose_cfg("evaluate", ["wic=superglue"])), split="validation")


def test_sts_is_skipped_with_instructions_by_default(compose_cfg, tmp_path):
    from outlierlab.evaluation.registry import EvalContext
    from outlierlab.evaluation.analyses.sts import run

    cfg = compose_cfg("evaluate", [])
    res = run(EvalContext(None, cfg.sts, cfg, ["none"], tmp_path))
    assert res.rows == [] and "Skipped: no STS data given" in res.markdown
    assert "sts.files=[pairs.csv]" in res.markdown and "sentence-transformers/stsb" in res.markdown
