"""Fixtures and helpers of the loop-monitor tests (tests/test_loop_monitor.py, tests/test_peft_monitor.py,
tests/test_sentence_transformers_monitor.py): tiny models, BPE tokenizers trained on the shipped held-out sentences
(nothing reaches a hub), a Trainer run, and the comparison of live monitor rows with the post-hoc job's.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from outlierlab.datamodules.eval_data import load_sentences
from outlierlab.monitoring.replay import analyze_hf_checkpoints
from outlierlab.models.layernorms import model_layernorms
from outlierlab.monitoring.history import read_history

SETTINGS = dict(n_sequences=8, n_pairs=100)  # small held-out batch: one forward pass per record stays cheap
BLOCK = 32


# ------------------------------------------------------------------------------------------- fixtures
def bpe_tokenizer(specials: list[str], roberta: bool):
    """A byte-level BPE (vocab 400) trained on held-out sentences: RoBERTa's specials and post-processor, or a
    GPT-2-like tokenizer with only ``<|endoftext|>`` (no pad token, no special token added)."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(load_sentences()[:500], vocab_size=400, min_frequency=2, special_tokens=specials,
                            show_progress=False)
    if roberta:
        bpe.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
        return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                       pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def roberta_tok():
    return bpe_tokenizer(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], roberta=True)


@pytest.fixture(scope="module")
def gpt2_tok():
    tok = bpe_tokenizer(["<|endoftext|>"], roberta=False)
    assert tok.pad_token is None  # the monitor must cope with a decoder tokenizer as it comes
    return tok


def tiny_roberta(tok, seed: int = 0):
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(seed)
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=BLOCK + 2, pad_token_id=1, bos_token_id=0,
                        eos_token_id=2)
    return RobertaForMaskedLM(cfg)


def tiny_gpt2(tok, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    eos = tok.eos_token_id
    cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=BLOCK, bos_token_id=eos,
                     eos_token_id=eos)
    return GPT2LMHeadModel(cfg)


def tiny_llama(tok, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    eos = tok.eos_token_id
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=64, max_position_embeddings=BLOCK, bos_token_id=eos,
                      eos_token_id=eos)
    return LlamaForCausalLM(cfg)


def perturb_layernorms(model, seed: int = 1) -> None:
    """Move every norm's gain/bias off (1, 0): divergence from init then depends on the true init snapshot."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for ln in model_layernorms(model).values():
            for p in (getattr(ln, "weight", None), getattr(ln, "bias", None)):
                if p is not None:
                    p.add_(0.1 * torch.randn(p.shape, generator=g))


def blocks(tok, n: int = 64, mlm: bool = False) -> list[dict]:
    """Fixed-length training blocks of training-like text (run_clm.py's ``group_texts``): no padding needed."""
    ids = [i for s in load_sentences()[600:1200] for i in tok(s)["input_ids"]]
    out = [ids[i * BLOCK:(i + 1) * BLOCK] for i in range(n)]
    assert all(len(b) == BLOCK for b in out)
    return [{"input_ids": b} if mlm else {"input_ids": b, "labels": list(b)} for b in out]


def train(model, tok, out: Path, collator, data, callback, max_steps: int = 6, resume: str | None = None,
          report_to: list[str] | None = None):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(out), max_steps=max_steps, save_steps=3, save_strategy="steps",
                             per_device_train_batch_size=4, learning_rate=3e-3, report_to=report_to or [], use_cpu=True,
                             logging_steps=100, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator, processing_class=tok,
                      callbacks=[callback])
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def by_step(rows) -> dict[int, dict[tuple, float]]:
    out: dict[int, dict[tuple, float]] = {}
    for r in rows:
        key = (r["name"], r["statistic"], r["dim"])
        assert key not in out.setdefault(r["step"], {}), f"duplicate row {r['step']} {key}"
        out[r["step"]][key] = r["value"]
    return out


def assert_same_rows(live: dict[tuple, float], posthoc: dict[tuple, float], what: str) -> None:
    assert live, f"{what}: no live rows"
    assert set(live) == set(posthoc), f"{what}: rows differ: {sorted(set(live) ^ set(posthoc))[:10]}"
    bad = [(k, live[k], posthoc[k]) for k in live
           if not (math.isnan(live[k]) and math.isnan(posthoc[k]))
           and not math.isclose(live[k], posthoc[k], rel_tol=1e-5, abs_tol=1e-6)]
    assert not bad, f"{what}: {len(bad)} values differ, e.g. {bad[:5]}"


def assert_matches_posthoc(output_dir: Path, steps: list[int], tok) -> dict:
    post = analyze_hf_checkpoints(output_dir, tokenizer=tok, **SETTINGS)
    assert post["steps"] == steps
    for name in ("layernorm", "hidden_states"):
        live = by_step(read_history(output_dir / "monitor" / f"{name}.csv"))
        ref = by_step(read_history(post[name]))
        for s in steps:
            assert_same_rows(live[s], ref[s], f"{name} step {s}")
    return post
