"""The loop monitors inside sentence-transformers' trainer:
``SentenceTransformerTrainer`` is a ``transformers.Trainer``, so :class:`~outlierlab.OutlierMonitorCallback` is its
one-line monitor too.  A ``SentenceTransformer`` wraps the Hugging Face body (its first module's ``auto_model``)
with pooling and no LM head: the monitors read the body and record the sentence-vector order change
(docs/order_use.md), and the post-hoc job on the trainer's checkpoints reproduces the live rows.

Tiny RoBERTa body (2 layers, width 32), BPE trained on the shipped held-out sentences: nothing reaches a hub.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sentence_transformers")

from outlierlab.datamodules.eval_data import load_sentences  # noqa: E402
from outlierlab.monitoring.history import read_history  # noqa: E402
from tests.loop_monitor_helpers import (SETTINGS, assert_matches_posthoc, by_step, perturb_layernorms,  # noqa: E402
                                     roberta_tok, tiny_roberta)

# each test runs a sentence-transformers fine-tune end to end: the full suite's, not the fast tier's
pytestmark = pytest.mark.slow

__all__ = ["roberta_tok"]  # the fixture, from tests/loop_monitor_helpers.py


def sentence_transformer(tok, path):
    """A SentenceTransformer (mean pooling) around a tiny RoBERTa body whose LayerNorms are off (1, 0)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer
    from transformers import RobertaModel

    body = RobertaModel(tiny_roberta(tok).config)
    perturb_layernorms(body)
    body.save_pretrained(path)
    tok.save_pretrained(path)
    return SentenceTransformer(modules=[Transformer(str(path), max_seq_length=32), Pooling(32, "mean")],
                               device="cpu")


def test_sentence_transformers_trainer_records_the_body_live_and_post_hoc(tmp_path, roberta_tok):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    from outlierlab import OutlierMonitorCallback

    model = sentence_transformer(roberta_tok, tmp_path / "init")
    texts = load_sentences()[600:648]
    pairs = Dataset.from_dict({"anchor": texts[0::2], "positive": texts[1::2]})  # neighbouring sentences
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "run"), max_steps=6, save_steps=3,
                                                save_strategy="steps", per_device_train_batch_size=4,
                                                learning_rate=3e-3, report_to=[], use_cpu=True, logging_steps=100,
                                                seed=0, disable_tqdm=True)
    callback = OutlierMonitorCallback(every_n_steps=2, image_every_n_steps=3, figures=False, writer=False, **SETTINGS)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs,
                                         loss=MultipleNegativesRankingLoss(model), callbacks=[callback])
    with pytest.warns(UserWarning, match="order use in nats is not measured"):  # no LM head: said once
        trainer.train()

    live = by_step(read_history(tmp_path / "run" / "monitor" / "hidden_states.csv"))
    assert sorted(live) == [0, 2, 3, 4, 6]
    change = {s: [live[s][(f"layer_{i}", "pooled_order_change", None)] for i in range(3)] for s in (0, 6)}
    assert all(c > 1e-6 for c in change[6]) and change[6] != change[0]  # the body being trained, with positions
    assert not any(k[1] == "order_use" for rows in live.values() for k in rows)
    layernorm = by_step(read_history(tmp_path / "run" / "monitor" / "layernorm.csv"))
    assert layernorm[6] != layernorm[0]
    # the checkpoints are the body with sentence-transformers' files beside it: the post-hoc job reads them alone
    assert_matches_posthoc(tmp_path / "run", [3, 6], roberta_tok)


def test_the_example_fine_tune_starts_from_the_committed_run(tmp_path):
    """examples/sentence_transformers_finetune.py on the shipped MiniLM: its step-0 rows (the untrained model on the
    held-out batch) equal those of the run docs/loop_monitors.md reports, so the committed numbers are this code's."""
    import importlib.util

    from tests.conftest import ROOT
    from tests.loop_monitor_helpers import assert_same_rows

    spec = importlib.util.spec_from_file_location("finetune", ROOT / "examples" / "sentence_transformers_finetune.py")
    finetune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(finetune)
    pairs = finetune.same_sense_pairs()
    assert len(pairs["anchor"]) == len(pairs["positive"]) == 2154
    with pytest.warns(UserWarning, match="order use in nats is not measured"):
        assert finetune.main([str(tmp_path), "--steps", "1", "--every", "1"]) == 0
    ours = by_step(read_history(tmp_path / "monitor" / "hidden_states.csv"))
    committed = by_step(read_history(ROOT / "docs" / "loop_monitors" / "minilm_wic" / "hidden_states.csv"))
    assert sorted(ours) == [0, 1]
    step0 = {k: v for k, v in committed[0].items() if k in ours[0]}  # the committed run wrote per-dim vectors too
    # the committed run predates the by-position rows (abs_argmax_share_pos_*): every other row must be there
    newer = {k for k in ours[0] if k not in step0}
    assert newer and {k[1].split("_pos_")[0] for k in newer} == {"abs_argmax_share"}
    assert_same_rows({k: v for k, v in ours[0].items() if k not in newer}, step0, "step 0")
