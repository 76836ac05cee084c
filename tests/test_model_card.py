"""The model card of a run's export (numbers = the run's CSVs) and `python -m outlierlab.jobs.export_run`
(card rewrite, remote code for an older export, the push to the Hub tested at its boundary)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from outlierlab.jobs import export_run as export_run_mod
from outlierlab.jobs.model_card import card_data, write_model_card
from outlierlab.jobs.run_state import mark_finished, verify_manifest
from outlierlab.models import EncoderConfig, RobertaMaskedLM, save_pretrained
from tests.conftest import ROOT

OVERRIDES = ["pos=alibi", "model.attention=gated", "trainer.max_steps=10", "data.batch_size=4"]


def _model_cfg(**kw) -> dict:
    return EncoderConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_len=16,
                         pos={"name": "alibi"}, attention="gated", **kw).to_dict()


def plant_run(run: Path, remote_code: bool = True) -> Path:
    """A finished run directory as train.py leaves it, with numbers a slip would change; returns its export."""
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(OVERRIDES))
    config = {"seed": 7, "objective": "mlm", "model": _model_cfg(), "tokenizer": {"name_or_path": None, "vocab_size": 50},
              "module": {"optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.0007, "betas": [0.9, 0.98],
                                       "eps": 1e-6, "weight_decay": 0.01},
                         "scheduler": {"_target_": "outlierlab.models.schedules.warmup_polynomial_decay",
                                       "num_warmup_steps": 3, "num_training_steps": 10}},
              "data": {"source": "embedded", "hub": None, "block_size": 16, "batch_size": 4, "max_documents": 400,
                       "mlm_probability": 0.15},
              "trainer": {"max_steps": 10, "accumulate_grad_batches": 2, "devices": 1, "num_nodes": 1,
                          "precision": "32-true", "gradient_clip_val": 1.0}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "csv").mkdir()
    (run / "csv" / "metrics.csv").write_text(
        "epoch,step,train/loss,train/lengths,val/loss,val/ppl,val/acc,val/order_use\n"
        "0,4,5.9,320,,,,\n"
        "0,4,,,5.8125,334.5,0.0625,0.0311\n"
        "0,9,5.5,640,,,,\n"
        "0,9,,,5.4321,228.6,0.125,\n"  # order use not measured at the last validation: the card takes step 4's
        "0,9,5.4,,,,,\n")
    (run / "monitor").mkdir()
    (run / "monitor" / "hidden_states.csv").write_text(
        "step,name,statistic,dim,value\n"
        "0,layer_0,argmax_share,3,0.9\n0,layer_0,kurtosis,,9.0\n"  # step 0 is not the last step
        "10,layer_0,argmax_share,3,0.25\n10,layer_0,kurtosis,,1.5\n10,layer_0,max_median,,4.25\n"
        "10,layer_1,argmax_share,11,0.4375\n10,layer_1,kurtosis,,2.75\n10,layer_1,max_median,,3.5\n"
        "10,layer_2,argmax_share,11,0.375\n10,layer_2,kurtosis,,3.125\n10,layer_2,max_median,,6.5\n"
        "10,layer_2,pooled_argmax_share,11,0.99\n"
        "0,layer_1,abs_argmax_share,5,0.125\n5,layer_1,abs_argmax_share,11,0.25\n10,layer_1,abs_argmax_share,11,0.5\n")
    (run / "monitor" / "layernorm.csv").write_text(
        "step,name,statistic,dim,value\n0,model,n_outlier_dims,,5\n0,model,min_layers,,2\n"
        "10,model,n_outlier_dims,,3\n10,model,min_layers,,2\n10,embeddings,gain_mean,,1\n")
    (run / "code_versions.jsonl").write_text(
        json.dumps({"started": "2026-01-01T00:00:00+00:00", "global_step_at_start": 0, "commit": "a" * 40,
                    "dirty": False}) + "\n"
        + json.dumps({"started": "2026-01-02T00:00:00+00:00", "global_step_at_start": 6, "commit": "b" * 40,
                      "dirty": True}) + "\n")
    model = RobertaMaskedLM(EncoderConfig.from_dict(_model_cfg())).eval()
    export = run / "model"
    save_pretrained(model, export, remote_code=remote_code)
    write_model_card(run, export, global_step=10)  # as train.py: before finished.json exists
    mark_finished(run, 10, 10, {"val/loss": 5.4321}, config)
    return export


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_card_numbers_are_the_runs_csvs(tmp_path):
    export = plant_run(tmp_path / "run")
    d = card_data(tmp_path / "run", export)
    card = (export / "README.md").read_text()
    # validation: the last row holding each metric, read here independently of the card's code, at the step of the
    # model it measured (this file logged validations at Lightning's batch counter, one below: 9 after 10 updates)
    rows = _csv(tmp_path / "run" / "csv" / "metrics.csv")
    for key in ("val/loss", "val/ppl", "val/acc", "val/order_use"):
        step, value = [(int(r["step"]) + 1, float(r[key])) for r in rows if r[key]][-1]
        assert d["val"][key] == {"step": step, "value": value}
        assert f"| `{key}` | {value:.6g} | {step} |" in card
    assert d["val"]["val/order_use"] == {"step": 5, "value": 0.0311}
    # outliers at the last monitored step (10), not step 0
    hs = [r for r in _csv(tmp_path / "run" / "monitor" / "hidden_states.csv") if r["step"] == "10"]
    share = max((r for r in hs if r["statistic"] == "argmax_share"), key=lambda r: float(r["value"]))
    kurt = max((r for r in hs if r["statistic"] == "kurtosis"), key=lambda r: float(r["value"]))
    assert d["hidden_states"]["step"] == 10
    assert d["hidden_states"]["max_argmax_share"] == {"value": float(share["value"]), "layer": share["name"],
                                                      "dim": int(share["dim"])}
    assert d["hidden_states"]["max_kurtosis"] == {"value": float(kurt["value"]), "layer": kurt["name"]}
    assert f"**Largest argmax share:** {float(share['value']):.6g} ({share['name']}, dim {share['dim']})" in card
    assert f"**Largest activation kurtosis:** {float(kurt['value']):.6g} ({kurt['name']})" in card
    # layer 1's |x| argmax dimension: 5 at step 0, 11 from step 5 on (planted); the other layers have no such rows
    assert {k: d["hidden_states"]["layers"]["layer_1"][k] for k in ("abs_argmax_dim", "abs_argmax_share", "held_since")} \
        == {"abs_argmax_dim": 11, "abs_argmax_share": 0.5, "held_since": 5}
    assert "| layer_1 | 0.4375 | 11 | 11 (0.5) | 5 | 2.75 | 3.5 |" in card and "| layer_0 | 0.25 | 3 | – | – |" in card
    ln = [r for r in _csv(tmp_path / "run" / "monitor" / "layernorm.csv")
          if r["step"] == "10" and r["statistic"] == "n_outlier_dims"]
    assert d["layernorm"]["n_outlier_dims"] == int(float(ln[0]["value"])) == 3
    assert "(`monitor/layernorm.csv`, step 10): 3 (" in card
    # recipe, tokens, command, code versions
    assert d["sequences_per_step"] == 4 * 2 and d["tokens_seen"] == 10 * 8 * 16
    assert "lr 0.0007" in card and "block size 16 tokens" in card and "**Tokens seen:** 1280" in card
    assert "python train.py pos=alibi model.attention=gated trainer.max_steps=10 data.batch_size=4" in card
    assert f"commit `{'a' * 40}`" in card and f"commit `{'b' * 40}` (uncommitted changes)" in card
    assert "trust_remote_code=True" in card and "AutoModelForMaskedLM" in card and "- custom_code" in card
    assert "`model.attention=gated`" in card and "Position scheme:** `alibi`" in card


def test_a_monitor_row_torn_by_a_kill_is_not_on_the_card(tmp_path):
    """A kill mid-write leaves a last line without its newline ("0.11982517" cut to "0.1"): the card reads the
    histories as the monitors' own reader does, and skips it."""
    export = plant_run(tmp_path / "run")
    before = card_data(tmp_path / "run", export)
    for name, line in (("hidden_states.csv", "15,layer_1,argmax_share,2,0.9"), ("layernorm.csv", "15,model,n_outl")):
        with open(tmp_path / "run" / "monitor" / name, "a") as f:
            f.write(line)
    after = card_data(tmp_path / "run", export)
    assert after["hidden_states"] == before["hidden_states"] and after["hidden_states"]["step"] == 10
    assert after["layernorm"] == before["layernorm"] and after["layernorm"]["step"] == 10


def test_card_of_a_native_export_and_of_a_bare_run(tmp_path):
    """A plain RoBERTa export needs no remote code; missing files leave their sections saying so."""
    model = RobertaMaskedLM(EncoderConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                                          intermediate_size=32, max_len=16)).eval()
    assert save_pretrained(model, tmp_path / "hf") == "hf"
    card = write_model_card(tmp_path, tmp_path / "hf").read_text()
    assert 'AutoModelForMaskedLM.from_pretrained("<this directory or repo id>")' in card
    assert "trust_remote_code" not in card and "custom_code" not in card
    assert "No validation metrics were logged" in card and "No hidden-state monitor output" in card
    assert "overrides were not found" in card


@pytest.mark.slow
def test_training_writes_a_card_and_a_remote_code_export(tmp_path, shared_cache):
    """train.py end to end (causal, ALiBi): model/ carries the card with the run's last val/loss, the remote code,
    and transformers alone gives the logits of outlierlab's loader; the finished run's manifest covers the card."""
    from outlierlab.jobs.training import train
    from outlierlab.models import load_pretrained
    from tests.run_fixtures import run_without_outlierlab
    from tests.run_fixtures import small_cfg

    run = tmp_path / "run"
    train(small_cfg(run, "objective=clm", "pos=alibi", "trainer.max_steps=2", "trainer.val_check_interval=2",
                    "trainer.limit_val_batches=1"))
    export = run / "model"
    assert json.loads((export / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"] == \
        "modeling_outlierlab.OutlierLabForCausalLM"
    card = (export / "README.md").read_text()
    rows = _csv(run / "csv" / "metrics.csv")
    step, loss = [(int(r["step"]), float(r["val/loss"])) for r in rows if r.get("val/loss")][-1]
    assert f"| `val/loss` | {loss:.6g} | {step} |" in card
    assert "**Steps:** 2 of max_steps 2" in card and "AutoModelForCausalLM" in card
    assert "model/README.md" in json.loads((run / "manifest.json").read_text())["files"]
    assert verify_manifest(run) == []
    ids = torch.tensor([[0, 11, 12, 13, 14, 2], [0, 21, 22, 2, 1, 1]])
    mask = (ids != 1).long()
    torch.save({"ids": ids, "mask": mask, "logits": load_pretrained(export).eval()(ids, mask).logits},
               tmp_path / "ref.pt")
    r = run_without_outlierlab(f"""
        import sys, torch
        from transformers import AutoModelForCausalLM
        ref = torch.load({str(tmp_path / 'ref.pt')!r})
        model = AutoModelForCausalLM.from_pretrained({str(export)!r}, trust_remote_code=True).eval()
        diff = (model(input_ids=ref["ids"], attention_mask=ref["mask"]).logits - ref["logits"]).abs().max()
        assert "outlierlab" not in sys.modules and diff <= 1e-5, float(diff)
        print("ok")
    """, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


# ------------------------------------------------------------------------------ python -m outlierlab.jobs.export_run
def test_export_run_rewrites_the_card_and_adds_remote_code_to_an_older_export(tmp_path):
    run = tmp_path / "run"
    export = plant_run(run, remote_code=False)  # an export written before remote code existed
    assert not (export / "config.json").exists()
    (run / "csv" / "metrics.csv").write_text(  # a later analysis changed what the card should say
        (run / "csv" / "metrics.csv").read_text() + "0,9,,,5.25,190.6,0.25,0.5\n")
    done = export_run_mod.export_run(run)
    assert "remote_code" in done and (export / "modeling_outlierlab.py").is_file()
    assert "| `val/loss` | 5.25 | 10 |" in (export / "README.md").read_text()  # logged at 9: the model after 10
    assert verify_manifest(run) == []  # the manifest was refreshed over the new card and config.json
    with pytest.raises(export_run_mod.ExportError, match="is not a train.py run directory"):
        export_run_mod.export_run(tmp_path / "run" / "csv")


@pytest.mark.parametrize("kind, says", [
    ("empty", r"is empty: pass a train.py run directory"),
    ("trainer", r"is a transformers Trainer output folder, not a train.py run"),
    ("export", r"is a model export itself, not a run directory: pass the run directory that holds it \(.*run\)"),
    ("unfinished", r"has no export \(hf/ or model/\): the run has not finished"),
])
def test_export_run_says_what_a_wrong_folder_is(tmp_path, kind, says):
    folder = tmp_path / "x"
    folder.mkdir()
    if kind == "trainer":
        (folder / "checkpoint-500").mkdir()
        (folder / "trainer_state.json").write_text("{}")
    elif kind == "export":
        folder = plant_run(tmp_path / "run")
    elif kind == "unfinished":
        (folder / "config.yaml").write_text("seed: 1\n")
        (folder / "checkpoints").mkdir()
    with pytest.raises(export_run_mod.ExportError, match=says) as e:
        export_run_mod.export_run(folder)
    assert len(str(e.value).splitlines()) == 1


def test_a_full_disk_during_export_run_never_leaves_an_export_that_counts_as_done(tmp_path, monkeypatch, capsys):
    """ENOSPC after a few hundred bytes while the remote code and config.json are written: one line naming the file,
    exit 1, no file torn under its own name, the manifest not refreshed over it; after space is freed the same
    command completes an export that transformers loads."""
    import transformers

    from outlierlab.utils import atomic
    from tests.disk_helpers import FillingFile

    run = tmp_path / "run"
    export = plant_run(run, remote_code=False)
    manifest = (run / "manifest.json").read_text()
    budget = {"left": 600}
    real_open = open

    monkeypatch.setattr(atomic, "open", lambda f, mode="r", *a, **k: FillingFile(real_open(f, mode, *a, **k), budget),
                        raising=False)
    assert export_run_mod.main([str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "free space" in err[0], err
    assert not (export / "config.json").exists()  # config.json comes last: never there without its code
    assert [f for f in (export / "configuration_outlierlab.py", export / "modeling_outlierlab.py")
            if f.exists() and f.stat().st_size == 0] == []
    assert not list(export.glob(".*partial*")) and (run / "manifest.json").read_text() == manifest
    monkeypatch.undo()  # space freed
    assert export_run_mod.main([str(run)]) == 0
    assert export_run_mod.export_problems(export) == [] and verify_manifest(run) == []
    config = transformers.AutoConfig.from_pretrained(export, trust_remote_code=True)
    assert config.model_type == "outlierlab"


def test_a_zero_byte_config_json_is_rewritten_not_trusted(tmp_path):
    run = tmp_path / "run"
    export = plant_run(run)
    (export / "config.json").write_text("")  # what a full disk left before writes were atomic
    assert export_run_mod.export_problems(export) == [f"{export / 'config.json'}: empty"]
    assert "remote_code" in export_run_mod.export_run(run)
    assert export_run_mod.export_problems(export) == []


def test_push_when_offline_fails_at_once_in_one_line(tmp_path):
    plant_run(tmp_path / "run")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "outlierlab.jobs.export_run", str(tmp_path / "run"),
                        "--push-to-hub", "someone/tiny"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert time.monotonic() - t0 < 60  # no retry loop (a hub call offline retries for ~30-50 s)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot push to someone/tiny") and "HF_HUB_OFFLINE" in lines[0]


def test_push_calls_the_hub_with_the_export(tmp_path, monkeypatch):
    import huggingface_hub

    from outlierlab.utils import hub

    export = plant_run(tmp_path / "run")
    calls = []

    class FakeApi:
        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", repo_id, kw))
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, **kw):
            calls.append(("upload_folder", kw))

    monkeypatch.setattr(hub, "hub_is_offline", lambda *a, **k: False)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    assert export_run_mod.main([str(tmp_path / "run"), "--push-to-hub", "someone/tiny", "--private"]) == 0
    assert calls[0] == ("create_repo", "someone/tiny", {"repo_type": "model", "private": True, "exist_ok": True})
    assert calls[1][0] == "upload_folder" and calls[1][1]["folder_path"] == str(export)
    assert calls[1][1]["repo_id"] == "someone/tiny" and calls[1][1]["repo_type"] == "model"

    class Refusing(FakeApi):
        def upload_folder(self, **kw):
            import httpx

            response = httpx.Response(403, request=httpx.Request("POST", "https://huggingface.co/api/x"))
            raise huggingface_hub.errors.HfHubHTTPError("403 Forbidden: no write access to someone/tiny\nmore",
                                                        response=response)

    monkeypatch.setattr(huggingface_hub, "HfApi", Refusing)
    with pytest.raises(export_run_mod.ExportError, match=r"^cannot push to someone/tiny: 403 Forbidden: no write "
                                                          r"access to someone/tiny$"):
        export_run_mod.push_to_hub(export, "someone/tiny")
