"""probe.py end to end (subprocess, tiny local BERT): files written, rows per layer x transform, CLI errors."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from probe_fixtures import SENTENCES, save_tiny_bert

ROOT = Path(__file__).resolve().parent.parent


def _probe(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, str(ROOT / "probe.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return str(save_tiny_bert(tmp_path_factory.mktemp("bert"), layers=2, hidden=32))


def _rows(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_defaults_compose_to_offline_minilm_position_probe(compose_cfg):
    from outlierlab.models.encoder_source import resolve_encoder
    from outlierlab.evaluation.core import selected_transforms

    cfg = compose_cfg("probe")
    assert cfg.task.kind == "position" and selected_transforms(cfg) == ["none"]
    assert resolve_encoder(cfg.encoder.name_or_path).kind == "hf"  # bundled all-MiniLM-L6-v2, no network
    assert (cfg.probe.max_positions, cfg.probe.epochs, cfg.probe.batch_size, cfg.probe.lr) == (300, 10, 128, 1e-3)
    many = compose_cfg("probe", ["transform=[none,clip,whiten]", "transform.dims=[3]", "transform.k=8"])
    assert selected_transforms(many) == ["none", "clip", "whiten"]
    assert list(many.transform.dims) == [3] and many.transform.k == 8


@pytest.mark.slow
def test_position_probe_end_to_end_three_transforms(tiny_bert, tmp_path):
    text = tmp_path / "sents.txt"
    text.write_text("\n".join(SENTENCES * 5) + "\n")
    run = tmp_path / "run"
    r = _probe(f"encoder.name_or_path={tiny_bert}", f"data.files=[{text}]", "probe.epochs=2",
               "transform=[none,clip,whiten]", "transform.dims=[0,5]", f"features.cache_dir={tmp_path / 'cache'}",
               f"hydra.run.dir={run}",
               "transform.allow_degenerate=true")  # 8 distinct sentences x 5: too few distinct tokens for 32 dims
    assert r.returncode == 0, r.stderr[-2000:]
    # the fits are not silent: a line before and after each transform's probes, in order
    said = [line.split(":")[0] + ":" + line.split(":")[1].split()[0] for line in r.stdout.splitlines()
            if line.startswith("[probe] ") and (": fitting " in line or ": fitted in " in line)]
    assert said == [f"[probe] {t}:{w}" for t in ("none", "clip", "whiten") for w in ("fitting", "fitted")]
    for f in ("position_probe.csv", "probe_report.md", "position_probe_accuracy.png",
              "position_probe_contribution.png", "position_probe_contribution_heatmap.png", "probe_info.json"):
        assert (run / f).is_file() and (run / f).stat().st_size > 0, f
    rows = _rows(run / "position_probe.csv")
    assert [(r["layer"], r["transform"]) for r in rows] == [
        (str(layer), t) for t in ("none", "clip", "whiten") for layer in range(3)]
    # the kept degenerate whitening is marked in every whitened row, with what it was fitted on
    assert {r["whiten_degenerate"] for r in rows if r["transform"] == "whiten"} == {"True"}
    assert {r["whiten_distinct"] for r in rows if r["transform"] == "whiten"} == {"60"}
    assert {r["whiten_fit"] for r in rows if r["transform"] == "none"} == {""}
    assert "DEGENERATE" in (run / "probe_report.md").read_text()
    n_tokens = sum(len(x) for x in __import__("transformers").AutoTokenizer.from_pretrained(tiny_bert)(
        SENTENCES * 5)["input_ids"])
    for row in rows:
        assert int(row["n_train"]) + int(row["n_val"]) + int(row["n_test"]) == n_tokens
        assert 0.0 <= float(row["accuracy"]) <= 1.0 and int(row["dropped_tokens"]) == 0
        assert row["clipped_dims"] == ("0;5" if row["transform"] == "clip" else "")  # ";" as evaluate's tables
    # clipped dims contribute nothing: they are absent from the clip rows' top neurons
    for row in rows:
        if row["transform"] == "clip":
            assert not {"0", "5"} & set(row["top_neurons"].split(";"))
    # per-position accuracy: test-token counts per position add up to n_test, and weighted by them the
    # per-position accuracies give back each layer's overall accuracy
    by_pos = _rows(run / "position_probe_by_position.csv")
    for row in rows:
        mine = [b for b in by_pos if b["layer"] == row["layer"] and b["transform"] == row["transform"]]
        assert sum(int(b["n_test"]) for b in mine) == int(row["n_test"])
        weighted = sum(int(b["n_test"]) * float(b["accuracy"]) for b in mine) / int(row["n_test"])
        assert weighted == pytest.approx(float(row["accuracy"]), abs=1e-5)
    md = (run / "probe_report.md").read_text()
    assert md.count("\n| ") == 1 + len(rows)  # header + one line per row
    assert "not one the model *uses*" in md and "analyses=[order_use]" in md  # decodable is not used
    # TensorBoard holds the same per-layer test accuracy as the CSV
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ev = EventAccumulator(str(run / "tensorboard")).Reload()
    for row in rows:
        tag = f"probe/{row['transform']}/layer_{row['layer']}/accuracy"
        assert ev.Scalars(tag)[-1].value == pytest.approx(float(row["accuracy"]), abs=1e-6)


def test_classifier_on_shipped_wordnet_pos_and_planted_local_csv(tiny_bert, tmp_path, compose_cfg):
    from outlierlab.evaluation.probing import run

    common = [f"encoder.name_or_path={tiny_bert}", f"features.cache_dir={tmp_path / 'cache'}", "progress=false"]
    out = run(compose_cfg("probe", common + ["task=wordnet_pos", "task.max_train=120", "task.max_eval=40",
                                             "probe.epochs=1"]), tmp_path / "pos")
    rows = _rows(tmp_path / "pos" / "classifier.csv")
    assert [r["layer"] for r in rows] == ["0", "1", "2"] and len(out["rows"]) == 3
    assert {(r["n_train"], r["n_val"], r["n_test"]) for r in rows} == {("120", "40", "40")}
    assert (tmp_path / "pos" / "classifier_accuracy.png").is_file()
    assert "not one the model *uses*" not in (tmp_path / "pos" / "probe_report.md").read_text()  # position only
    # Planted task: the label is which of two words ends the sentence -> linearly separable mean vectors.
    import random

    rnd = random.Random(0)
    words = "the a sea ship river town house ran saw old new long day night".split()
    lines = ["text,label"] + [f"{' '.join(rnd.choices(words, k=6))} {('happy', 'angry')[i % 2]},{i % 2}"
                              for i in range(300)]
    (tmp_path / "planted.csv").write_text("\n".join(lines) + "\n")
    run(compose_cfg("probe", common + ["task=local", f"task.files=[{tmp_path / 'planted.csv'}]", "probe.epochs=30",
                                       "probe.lr=0.01", "transform=[none,whiten]"]), tmp_path / "loc")
    rows = _rows(tmp_path / "loc" / "classifier.csv")
    assert {(r["n_train"], r["n_val"], r["n_test"]) for r in rows} == {("240", "30", "30")}  # 10% + 10% carved
    assert all(float(r["chance"]) < 0.7 for r in rows)
    best = {t: max(float(r["accuracy"]) for r in rows if r["transform"] == t) for t in ("none", "whiten")}
    # measured: none 0.90-0.93 (random tiny BERT vectors are anisotropic), whiten 1.0
    assert best["none"] >= 0.8 and best["whiten"] >= 0.95, best


def test_bad_names_and_offline_hub_fail_with_one_line(tmp_path):
    r = _probe("transform=whitn", f"hydra.run.dir={tmp_path / 'a'}")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: unknown transform 'whitn'; valid: abtt, center, clip, none, standardize, whiten"
    r = _probe("encoder.name_or_path=roberta-base", f"hydra.run.dir={tmp_path / 'b'}")
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "offline" in err[0] and "roberta-base" in err[0]


@pytest.mark.parametrize("override, message", [
    ("probe.epochs=-1", "probe.epochs must be >= 1, got -1"),  # Lightning: max_epochs=-1 trains forever
    ("probe.epochs=0", "probe.epochs must be >= 1, got 0"),  # an untrained probe's accuracy
    ("probe.epochs=two", "probe.epochs='two': expected int, got str"),
    ("probe.epochs=1.5", "probe.epochs=1.5: expected int, got float"),  # not silently 1
    ("probe.max_positions=0", "probe.max_positions must be >= 1, got 0"),
    ("probe.lr=abc", "probe.lr='abc': expected float, got str"),
    ("probe.lr=0", "probe.lr must be > 0, got 0"),
    ("task=sst2 task.batch_size=0", "task.batch_size must be >= 1, got 0"),
    ("outliers.threshold=high", "outliers.threshold='high': expected float, got str"),
    ("outliers.threshold=2", "outliers.threshold must be <= 1, got 2"),
    ("seed=abc", "seed must be an integer, got 'abc'"),
    ("probe.include_special=no", "probe.include_special='no': expected bool, got str"),  # 'no' read as true
    ("probe.order_use=off", "probe.order_use='off': expected bool, got str"),
    ("probe.max_distance=0", "probe.max_distance must be >= 1 or null, got 0"),
    ("seed=1.5", "seed must be an integer, got 1.5"),
    # checked by the class only (split_indices refused these after every text was encoded)
    ("probe.splits=[0.8,0.2]", "probe.splits must be three fractions >= 0 (train, validation, test; train and test "
                               "> 0), got [0.8, 0.2]"),
    ("probe.splits=[0.9,0.1,0]", "probe.splits must be three fractions >= 0 (train, validation, test; train and "
                                 "test > 0), got [0.9, 0.1, 0.0]"),
    ("probe.splits=[0.8,0.1,x]", "probe.splits[2]='x': expected float, got str"),
])
def test_bad_probe_settings_refused_in_one_line_naming_the_key(compose_cfg, override, message):
    from outlierlab.evaluation.probing import check_settings

    check_settings(compose_cfg("probe"))  # the defaults pass
    with pytest.raises(ValueError) as e:
        check_settings(compose_cfg("probe", override.split()))
    assert str(e.value) == message


def test_probe_settings_defaults_are_the_composed_config(compose_cfg):
    """The class states configs/probe.yaml's defaults (so ``ProbeSettings(epochs=2)`` is the YAML with one change);
    a default changed on one side only fails here."""
    from outlierlab.configuration.settings_store import load_settings
    from outlierlab.configuration.probe_settings import ProbeSettings

    assert load_settings(ProbeSettings, compose_cfg("probe").probe) == ProbeSettings()
    assert ProbeSettings(epochs=2).epochs == 2
    with pytest.raises(ValueError, match=r"^probe.top_k must be >= 1, got 0$"):
        ProbeSettings(top_k=0)  # from Python as from the command line
    with pytest.raises(ValueError, match=r"^unknown key\(s\) probe.epoch; valid keys of probe: max_positions, "):
        ProbeSettings(epoch=2)


@pytest.mark.slow
def test_negative_epochs_fail_before_the_model_loads(tmp_path):
    # Lightning's max_epochs=-1 is "no limit": this probe ran until killed, with nothing on the console
    r = _probe("probe.epochs=-1", "data.max_sentences=20", f"hydra.run.dir={tmp_path / 'a'}")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == "error: probe.epochs must be >= 1, got -1"
    assert not (tmp_path / "a" / "tensorboard").exists()  # refused before the run started
