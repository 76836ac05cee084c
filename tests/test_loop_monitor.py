"""Monitors for any loop: the Hugging Face Trainer callback and the plain-loop monitor write the rows the
post-hoc analysis computes on the checkpoints of the same steps, only on rank 0, and continue after a resume.

Every model is tiny (2 layers, width 32) and every tokenizer is trained here on the shipped held-out sentences:
nothing reaches a hub.
"""

from __future__ import annotations

import copy
import math
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from outlierlab.metrics.monitor_records import hidden_state_records, layernorm_records, layernorm_snapshot, tokenize_heldout
from outlierlab.metrics.word_order import attention_locality, lm_loss_sum, masked_for_order_use, order_use
from outlierlab.datamodules.eval_data import load_sentences
from outlierlab.monitoring.replay import analyze_hf_checkpoints
from outlierlab.models.layernorms import model_layernorms
from outlierlab.models.sites import monitored_forward
from outlierlab.monitoring.hidden_state_tracker import heldout_max_length
from outlierlab.monitoring.loop_monitor import INITIAL_SNAPSHOT, OutlierMonitor
from outlierlab.monitoring.history import HistoryCSV, read_history
from tests.loop_monitor_helpers import (BLOCK, SETTINGS, assert_matches_posthoc, assert_same_rows, blocks, by_step,
                                        gpt2_tok, perturb_layernorms, roberta_tok, tiny_gpt2, tiny_llama,
                                        tiny_roberta, train)

__all__ = ["roberta_tok", "gpt2_tok"]  # the fixtures, from tests/loop_monitor_helpers.py


# ---------------------------------------------------------------------------------- HF Trainer callback
def test_trainer_callback_rows_equal_posthoc_on_the_checkpoints_roberta(tmp_path, roberta_tok):
    from transformers import DataCollatorForLanguageModeling

    from outlierlab import OutlierMonitorCallback

    writer = RecordingWriter()
    callback = OutlierMonitorCallback(tokenizer=roberta_tok, every_n_steps=2, image_every_n_steps=3, figures=False,
                                      writer=writer, **SETTINGS)
    model = tiny_roberta(roberta_tok)
    perturb_layernorms(model)
    collator = DataCollatorForLanguageModeling(roberta_tok, mlm=True, mlm_probability=0.15)
    train(model, roberta_tok, tmp_path, collator, blocks(roberta_tok, mlm=True), callback)

    hidden = read_history(tmp_path / "monitor" / "hidden_states.csv")
    # step 0 (train begin), the cadence (2, 4, 6) and the checkpoint save at 3
    assert sorted({r["step"] for r in hidden}) == [0, 2, 3, 4, 6]
    assert (tmp_path / "monitor" / INITIAL_SNAPSHOT).is_file()
    assert_matches_posthoc(tmp_path, [3, 6], roberta_tok)
    live = by_step(read_history(tmp_path / "monitor" / "layernorm.csv"))
    # the post-hoc step 0 comes from the snapshot the callback wrote; the weights did move afterwards
    post0 = by_step(read_history(tmp_path / "monitor_posthoc" / "layernorm.csv"))[0]
    assert_same_rows({k: v for k, v in live[0].items()}, post0, "layernorm step 0")
    assert live[6][("layer.1.output", "max_abs_gain_div", live_dim(live[6], "layer.1.output"))] > 0
    assert by_step(hidden)[3] != by_step(hidden)[6]
    # TensorBoard scalars at every record, under the Lightning monitors' tags
    assert {s for t, s in writer.scalars if t == "monitor/layernorm/n_outlier_dims"} == {0, 2, 3, 4, 6}
    assert any(t == "monitor/hidden/layer_2/kurtosis" for t, _ in writer.scalars)


def live_dim(rows: dict, name: str) -> int:
    return next(d for (n, s, d) in rows if n == name and s == "max_abs_gain_div")


def test_trainer_callback_rows_equal_posthoc_on_the_checkpoints_gpt2(tmp_path, gpt2_tok):
    from transformers import default_data_collator

    from outlierlab import OutlierMonitorCallback

    callback = OutlierMonitorCallback(every_n_steps=2, image_every_n_steps=3, figures=False, **SETTINGS)
    model = tiny_gpt2(gpt2_tok)
    impl = model.config._attn_implementation
    train(model, gpt2_tok, tmp_path, default_data_collator, blocks(gpt2_tok), callback)  # tokenizer: processing_class
    assert gpt2_tok.pad_token is None  # the monitor padded its batch itself, the caller's tokenizer is untouched
    assert model.config._attn_implementation == impl  # eager only for the monitor's own passes
    post = assert_matches_posthoc(tmp_path, [3, 6], gpt2_tok)
    rows = read_history(post["hidden_states"])
    names = {r["name"] for r in rows}
    assert {"layer_0", "layer_1", "layer_2"} <= names
    assert any(r["statistic"] == "attn_entropy" for r in rows)  # attention probabilities came back (eager pass)
    # pre-LN GPT-2: the rule judges both per-layer norms (attention_input, mlp_input)
    ln = {r["name"] for r in read_history(tmp_path / "monitor" / "layernorm.csv")}
    assert {"layer.0.attention_input", "layer.0.mlp_input", "final"} <= ln


def test_trainer_callback_resume_drops_and_reappends_rows(tmp_path, roberta_tok):
    from transformers import DataCollatorForLanguageModeling

    from outlierlab import OutlierMonitorCallback

    collator = DataCollatorForLanguageModeling(roberta_tok, mlm=True, mlm_probability=0.15)
    data = blocks(roberta_tok, mlm=True)
    kw = dict(tokenizer=roberta_tok, every_n_steps=2, image_every_n_steps=3, figures=False, **SETTINGS)
    model = tiny_roberta(roberta_tok)
    perturb_layernorms(model)
    train(model, roberta_tok, tmp_path, collator, data, OutlierMonitorCallback(**kw), report_to=["tensorboard"])
    hist = HistoryCSV(tmp_path / "monitor" / "hidden_states.csv")
    before = by_step(hist.rows())
    hist.append([(5, "layer_1", "kurtosis", None, 123.0)])  # a row of the abandoned timeline, past checkpoint-3

    resumed = tiny_roberta(roberta_tok, seed=7)  # other weights: the checkpoint's must be the ones recorded
    train(resumed, roberta_tok, tmp_path, collator, data, OutlierMonitorCallback(**kw),
          resume=str(tmp_path / "checkpoint-3"), report_to=["tensorboard"])
    after = hist.rows()
    steps = Counter(r["step"] for r in after if (r["name"], r["statistic"]) == ("layer_1", "kurtosis"))
    assert steps == {0: 1, 2: 1, 3: 1, 4: 1, 6: 1}  # 5 dropped, 3 re-recorded once, no gap, no duplicate
    after = by_step(after)
    for s in (0, 2, 3):  # kept (0, 2) or recorded again from the same weights (3)
        assert_same_rows(after[s], before[s], f"step {s} across the resume")
    assert_matches_posthoc(tmp_path, [3, 6], roberta_tok)  # divergence still from the first session's snapshot
    # its own TensorBoard run, read as TensorBoard reads it: the redone steps (3, 4, 6) once each, not twice
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "runs" / "outlier_monitor"  # the callback's own run beside the Trainer's
    acc = EventAccumulator(str(board), size_guidance={"scalars": 0})
    acc.Reload()
    shown = {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert len(list(board.glob("events.out.tfevents.*"))) == 2
    assert shown and all(max(Counter(v).values()) == 1 for v in shown.values()), shown
    assert any(sorted(v) == [0, 2, 3, 4, 6] for v in shown.values()), shown


# ----------------------------------------------------------------------------------------- plain loop
class RecordingWriter:
    """A stand-in ``SummaryWriter``: what was logged."""

    def __init__(self):
        self.scalars: list[tuple[str, int]] = []

    def add_scalar(self, tag, value, step):
        assert math.isfinite(float(value)) or math.isnan(float(value))
        self.scalars.append((tag, int(step)))

    def add_histogram(self, tag, values, step):
        pass

    def add_image(self, tag, img, step, dataformats="HWC"):
        pass

    def flush(self):
        pass


def plain_loop(model, tok, monitor, steps: range, save_at=(), out: Path | None = None, seed: int = 0):
    """A hand-written causal-LM loop: AdamW, fixed blocks, ``monitor.step`` after every update."""
    data = blocks(tok, n=len(steps) * 2 + 2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(seed)
    model.train()
    if steps.start == 1:
        monitor.step(model, 0)  # before the first update: the init snapshot and step 0
    for step in steps:
        batch = data[2 * (step - 1): 2 * step]
        ids = torch.tensor([b["input_ids"] for b in batch])
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        monitor.step(model, step)
        if step in save_at:
            model.save_pretrained(out / f"checkpoint-{step}")
            tok.save_pretrained(out / f"checkpoint-{step}")
    return model


def test_plain_loop_rows_equal_posthoc_llama_and_resume(tmp_path, gpt2_tok):
    tok = gpt2_tok
    model = tiny_llama(tok)
    perturb_layernorms(model)  # RMSNorm gains: judged on the gain alone
    writer = RecordingWriter()
    monitor = OutlierMonitor(model, tokenizer=tok, out_dir=tmp_path / "monitor", every_n_steps=2,
                             image_every_n_steps=3, figures=False, writer=writer, **SETTINGS)
    plain_loop(model, tok, monitor, range(1, 6), save_at=(3,), out=tmp_path)
    monitor.record(model, 5, images=True)  # the end of the loop, off the cadence
    model.save_pretrained(tmp_path / "checkpoint-5")
    assert sorted({s for _, s in writer.scalars}) == [0, 2, 4, 5]
    # step 3 had no record (off the cadence): post-hoc on its checkpoint must still equal a live record of it
    live_rows = read_history(tmp_path / "monitor" / "hidden_states.csv")
    assert sorted({r["step"] for r in live_rows}) == [0, 2, 4, 5]
    post = analyze_hf_checkpoints(tmp_path, tokenizer=tok, **SETTINGS)
    for name in ("layernorm", "hidden_states"):
        live, ref = by_step(read_history(tmp_path / "monitor" / f"{name}.csv")), by_step(read_history(post[name]))
        assert_same_rows(live[5], ref[5], f"{name} step 5")
        if name == "layernorm":  # post-hoc step 0 comes from the init snapshot the monitor wrote
            assert_same_rows(live[0], ref[0], "layernorm step 0")

    # resume from checkpoint-3 in a new process's worth of objects: rows at steps >= 3 go, 3 is recorded again
    from transformers import LlamaForCausalLM

    monitor.close()  # the first process's monitor ends (its folder lock with it)

    resumed = LlamaForCausalLM.from_pretrained(tmp_path / "checkpoint-3")
    monitor2 = OutlierMonitor(tokenizer=tok, out_dir=tmp_path / "monitor", every_n_steps=2, image_every_n_steps=3,
                              figures=False, writer=False, **SETTINGS)
    assert monitor2.step(resumed, 3)  # the first call starts the (resumed) session and records
    rows = by_step(read_history(tmp_path / "monitor" / "layernorm.csv"))
    assert sorted(rows) == [0, 2, 3]
    assert_same_rows(rows[3], by_step(read_history(post["layernorm"]))[3], "layernorm step 3 after resume")
    assert not monitor2.step(resumed, 3) and monitor2.step(resumed, 4)
    assert sorted(by_step(read_history(tmp_path / "monitor" / "hidden_states.csv"))) == [0, 2, 3, 4]


def test_plain_loop_on_our_own_encoder_equals_the_pure_functions(tmp_path, roberta_tok):
    """Our ``RobertaMaskedLM`` in a hand-written MLM loop: the rows of step 4 are the analysis functions' rows on
    a copy of the model taken at step 4 (what the post-hoc job computes on a checkpoint)."""
    from outlierlab.models import EncoderConfig, RobertaMaskedLM

    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=len(roberta_tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                        max_len=BLOCK)
    model = RobertaMaskedLM(cfg)
    perturb_layernorms(model)
    init = layernorm_snapshot(model_layernorms(model))
    monitor = OutlierMonitor(model, tokenizer=roberta_tok, out_dir=tmp_path / "monitor", every_n_steps=4,
                             image_every_n_steps=4, figures=True, writer=False, **SETTINGS)
    data = torch.tensor([b["input_ids"] for b in blocks(roberta_tok, n=8, mlm=True)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    monitor.step(model, 0)
    copy_at_4 = None
    for step in range(1, 5):
        ids = data[2 * (step - 1): 2 * step]
        labels = ids.clone()
        masked = ids.clone()
        masked[:, 1::5] = roberta_tok.mask_token_id
        out = model(masked, torch.ones_like(ids), labels=labels)
        (out["loss"] if isinstance(out, dict) else out.loss).backward()
        opt.step()
        opt.zero_grad()
        monitor.step(model, step)
        if step == 4:
            copy_at_4 = copy.deepcopy(model)
    assert model.training  # the monitor restored train mode
    copy_at_4.eval()
    ln_ref = layernorm_records(4, layernorm_snapshot(model_layernorms(copy_at_4)), init, top_k=3)[0]
    batch = tokenize_heldout(roberta_tok, load_sentences()[:8], heldout_max_length(copy_at_4, roberta_tok))
    with torch.inference_mode():
        hidden, attn, inf = monitored_forward(copy_at_4, batch["input_ids"], batch["attention_mask"])
        hs_ref = hidden_state_records(4, hidden, batch["attention_mask"], batch["special_tokens_mask"], n_pairs=100,
                                      attentions=attn, input_ids=batch["input_ids"], bos_token_id=cfg.bos_token_id,
                                      eos_token_id=cfg.eos_token_id, inf_norms=inf)[0]
        # order use from the analysis functions themselves: the fixed masked problem, <s> </s> <pad> kept in place
        problem = masked_for_order_use(batch["input_ids"], batch["attention_mask"], batch["special_tokens_mask"],
                                       roberta_tok.mask_token_id)
        ou = order_use(lm_loss_sum(copy_at_4, False), [problem], [cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id])
        local = attention_locality(attn, batch["attention_mask"])
    hs_ref = [*hs_ref, (4, "model", "order_use", None, ou["order_use"]), (4, "model", "attn_local_uniform", None,
                                                                          float(local["uniform"])),
              *[(4, f"layer_{i + 1}", "attn_local", None, float(m)) for i, m in enumerate(local["mass"])]]
    for name, ref in (("layernorm", ln_ref), ("hidden_states", hs_ref)):
        path = tmp_path / "monitor" / f"{name}.csv"
        ref_csv = tmp_path / f"ref_{name}.csv"
        HistoryCSV(ref_csv).append(ref)  # through the same %.8g text as the live file
        assert_same_rows(by_step(read_history(path))[4], by_step(read_history(ref_csv))[4], name)
    assert (tmp_path / "monitor" / "hidden_mean_vectors.png").is_file()
    assert (tmp_path / "monitor" / "layernorm_heatmap_gain.png").is_file()


def test_plain_loop_writes_nothing_off_rank_zero(tmp_path, gpt2_tok):
    model = tiny_gpt2(gpt2_tok)
    monitor = OutlierMonitor(model, tokenizer=gpt2_tok, out_dir=tmp_path / "monitor", every_n_steps=1,
                             global_zero=False, **SETTINGS)
    assert monitor.hidden.batch is None  # not even tokenised
    assert not monitor.step(model, 0) and not monitor.step(model, 1)
    monitor.record(model, 2)
    assert not (tmp_path / "monitor").exists()


@pytest.mark.slow
def test_top_level_import_stays_light():
    import subprocess
    import sys

    code = ("import sys, outlierlab; assert 'torch' not in sys.modules and 'transformers' not in sys.modules; "
            "from outlierlab import OutlierMonitorCallback; import transformers; "
            "assert issubclass(OutlierMonitorCallback, transformers.TrainerCallback)")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_trainer_callback_reports_into_the_trainers_mlflow_run(tmp_path, roberta_tok, monkeypatch):
    """report_to=["mlflow"]: the monitor's scalars land in the run MLflowCallback started, at the Trainer's steps."""
    pytest.importorskip("mlflow")
    import mlflow
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from outlierlab import OutlierMonitorCallback

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "monitor_test")
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "0")
    callback = OutlierMonitorCallback(tokenizer=roberta_tok, every_n_steps=2, figures=False, **SETTINGS)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, save_strategy="no",
                             per_device_train_batch_size=4, learning_rate=3e-3, report_to=["mlflow"], use_cpu=True,
                             logging_steps=2, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    collator = DataCollatorForLanguageModeling(roberta_tok, mlm=True, mlm_probability=0.15)
    Trainer(model=tiny_roberta(roberta_tok), args=args, train_dataset=blocks(roberta_tok, n=16, mlm=True),
            data_collator=collator, processing_class=roberta_tok, callbacks=[callback]).train()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.tracking.MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("monitor_test").experiment_id])
    history = client.get_metric_history(run.info.run_id, "monitor/layernorm/n_outlier_dims")
    assert sorted(m.step for m in history) == [0, 2, 4]
    assert "train_loss" in run.data.metrics  # the Trainer's own metrics: the same run
    live = read_history(tmp_path / "out" / "monitor" / "layernorm.csv")
    at4 = next(r["value"] for r in live if r["step"] == 4 and r["statistic"] == "n_outlier_dims")
    assert next(m.value for m in history if m.step == 4) == at4


def test_order_use_in_a_plain_loop_zero_without_positions_and_said_in_one_line(tmp_path, roberta_tok, capsys):
    """Order use is measured at every record of a loop monitor (docs/order_use.md).  A Hugging Face RoBERTa whose
    position table is zero is permutation-equivariant: its order use is 0 up to float rounding, and ``close()``
    says in one line that it does not use token order; the same model with its random table is not 0.  A body
    without an LM head gets one notice and, instead of order use in nats, the sentence-vector order change of every
    layer: 0 for the body whose position table is zero (permutation-equivariant), not 0 with its table."""
    from transformers import RobertaModel

    def order_rows(model, out):
        monitor = OutlierMonitor(model, tokenizer=roberta_tok, out_dir=out, writer=False, figures=False, **SETTINGS)
        monitor.step(model, 0)
        monitor.close()
        return {(r["name"], r["statistic"]): r["value"] for r in read_history(out / "hidden_states.csv")
                if r["statistic"] in ("order_use", "attn_local", "attn_local_uniform", "pooled_order_change")}

    with_table = order_rows(tiny_roberta(roberta_tok), tmp_path / "learned")
    assert abs(with_table["model", "order_use"]) > 1e-5
    assert {("layer_1", "attn_local"), ("layer_2", "attn_local"), ("model", "attn_local_uniform")} <= set(with_table)
    assert "does not use token order" in capsys.readouterr().out  # a random model is below the threshold
    flat = tiny_roberta(roberta_tok)
    with torch.no_grad():
        flat.roberta.embeddings.position_embeddings.weight.zero_()
    assert abs(order_rows(flat, tmp_path / "zero")["model", "order_use"]) < 1e-5
    assert not any(k[1] == "pooled_order_change" for k in with_table)  # with its LM head: order use in nats
    torch.manual_seed(0)
    body_model = RobertaModel(tiny_roberta(roberta_tok).config)
    with pytest.warns(UserWarning, match="order use in nats is not measured"):
        body = order_rows(body_model, tmp_path / "body")
    n_hidden = body_model.config.num_hidden_layers + 1
    assert "order_use" not in {k[1] for k in body} and ("layer_1", "attn_local") in body
    assert all(body[f"layer_{i}", "pooled_order_change"] > 1e-6 for i in range(n_hidden))
    with torch.no_grad():
        body_model.embeddings.position_embeddings.weight.zero_()
    with pytest.warns(UserWarning, match="order use in nats is not measured"):
        flat_body = order_rows(body_model, tmp_path / "flat_body")
    assert all(abs(flat_body[f"layer_{i}", "pooled_order_change"]) < 1e-6 for i in range(n_hidden))


def test_a_body_without_its_head_records_its_vectors_order_change_live_and_post_hoc(tmp_path, roberta_tok):
    """A RoBERTa body (a sentence encoder fine-tuned with a loss of its own has no LM head): the plain-loop monitor
    records the sentence-vector order change of every layer, and the post-hoc job on its saved checkpoint (loaded
    with a head class whose weights are missing, so kept as the body) writes the same rows."""
    from transformers import RobertaModel

    torch.manual_seed(0)
    body = RobertaModel(tiny_roberta(roberta_tok).config)
    perturb_layernorms(body)
    monitor = OutlierMonitor(body, tokenizer=roberta_tok, out_dir=tmp_path / "monitor", figures=False, writer=False,
                             **SETTINGS)
    with pytest.warns(UserWarning, match="order use in nats is not measured"):
        monitor.record(body, 5, images=False)
    monitor.close()
    body.save_pretrained(tmp_path / "checkpoint-5")
    live = by_step(read_history(tmp_path / "monitor" / "hidden_states.csv"))[5]
    changes = [live[(f"layer_{i}", "pooled_order_change", None)] for i in range(3)]
    assert all(c > 1e-6 for c in changes) and not any(k[1] == "order_use" for k in live)
    post = analyze_hf_checkpoints(tmp_path, tokenizer=roberta_tok, **SETTINGS)
    assert_same_rows(live, by_step(read_history(post["hidden_states"]))[5], "hidden_states step 5")
    assert read_history(post["hidden_states"]) and post["steps"] == [5]


def test_a_second_monitor_on_one_folder_is_refused_and_the_first_keeps_its_rows(tmp_path, gpt2_tok):
    """Two loops given one out_dir: the second monitor's start is refused in one line naming the holder, before it
    truncates anything; the first goes on writing; once it is closed the folder is free again."""
    from outlierlab.utils.dir_lock import DirBusy

    tok = gpt2_tok
    model = tiny_llama(tok)
    first = OutlierMonitor(model, tokenizer=tok, out_dir=tmp_path / "monitor", every_n_steps=1, figures=False,
                           writer=False, **SETTINGS)
    assert first.step(model, 0) and first.step(model, 1)
    before = (tmp_path / "monitor" / "hidden_states.csv").read_text()
    second = OutlierMonitor(model, tokenizer=tok, out_dir=tmp_path / "monitor", every_n_steps=1, figures=False,
                            writer=False, **SETTINGS)
    with pytest.raises(DirBusy, match=rf"monitor folder .*monitor is in use by pid {os.getpid()} on .*close\(\) it"):
        second.step(model, 0)
    assert len(str(DirBusy(tmp_path, {"pid": 1, "host": "h"}, "monitor folder")).splitlines()) == 1
    assert (tmp_path / "monitor" / "hidden_states.csv").read_text() == before  # nothing truncated
    assert first.step(model, 2)
    assert sorted({r["step"] for r in read_history(tmp_path / "monitor" / "hidden_states.csv")}) == [0, 1, 2]
    first.close()
    third = OutlierMonitor(model, tokenizer=tok, out_dir=tmp_path / "monitor", every_n_steps=1, figures=False,
                           writer=False, **SETTINGS)
    assert third.step(model, 3)  # a resumed session at step 3 in the freed folder
    third.close()


def test_a_fresh_run_in_an_earlier_runs_folder_shows_only_its_own_history(tmp_path, roberta_tok):
    """A plain loop run twice from step 0 into one out_dir (the second with the hidden-state monitor off): TensorBoard
    showed the first run's events mixed with the second's (steps 0 1 2 3 0 1 in one curve) and the first run's
    hidden_states.csv stayed beside the second run's layernorm.csv."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tok, folder = roberta_tok, tmp_path / "monitor"
    model = tiny_roberta(tok)
    first = OutlierMonitor(model, tokenizer=tok, out_dir=folder, every_n_steps=1, figures=False, **SETTINGS)
    for step in range(4):
        first.step(model, step)
    first.close()
    assert (folder / "hidden_states.csv").is_file()
    second = OutlierMonitor(model, tokenizer=tok, out_dir=folder, every_n_steps=1, figures=False,
                            hidden_states=False, **SETTINGS)
    for step in range(2):
        second.step(model, step)
    second.close()
    assert not (folder / "hidden_states.csv").exists()
    assert sorted({r["step"] for r in read_history(folder / "layernorm.csv")}) == [0, 1]
    acc = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    steps = {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    layernorm = {t: s for t, s in steps.items() if t.startswith("monitor/layernorm/")}
    assert layernorm and all(s == [0, 1] for s in layernorm.values())
    assert all(s == [] for t, s in steps.items() if t.startswith("monitor/hidden/"))  # the first run's: dropped
