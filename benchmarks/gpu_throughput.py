"""train.py's training step against Hugging Face's ``RobertaForMaskedLM`` trained by ``transformers.Trainer`` at its
best settings, on the same batches: tokens/s, MFU and peak memory, appended to docs/gpu/throughput.csv.

* ``ours``: our ``MLMLitModule`` in a Lightning ``Trainer`` as train.py builds it (bf16-mixed, the LM head on masked
  tokens only, no attention mask on packed blocks, fused AdamW, the vocabulary padded to a multiple of
  ``--vocab-multiple`` (64: 50,265 -> 50,304; 1 = none), ``torch.compile`` with ``--compile``);
* ``hf``: ``RobertaForMaskedLM(attn_implementation="sdpa")`` of the same sizes in ``transformers.Trainer``
  (``bf16=True``, ``optim="adamw_torch_fused"``, ``torch_compile`` with ``--compile``), fed the collator's
  ``input_ids, attention_mask, labels`` as a user would.

Both see the same pre-masked batches (random ids, 15 % masked by transformers' DataCollatorForLanguageModeling,
seeded), gradient clipping 1.0, AdamW (0.9, 0.98), eps 1e-6. Timing: the wall clock from the end of warm-up step
``--warmup`` to the last step, with ``torch.cuda.synchronize`` at both ends. MFU uses
:mod:`outlierlab.utils.flops` (6·N + 12·L·T·d per token, the head counted for the masked tokens) against the card's
dense bf16 peak (``--peak-tflops`` for a card not in the table).

    python benchmarks/gpu_throughput.py --model base --block 128 --impl ours,hf --compile     # on a GPU
    python benchmarks/gpu_throughput.py --model medium --block 512
    python benchmarks/gpu_throughput.py --tiny --no-write                                   # CPU smoke test
    python benchmarks/gpu_throughput.py --model base --block 128 --impl ours --deterministic   # the switch's cost

``--deterministic``: deterministic algorithms only -- ours with Lightning's ``Trainer(deterministic=True)`` (what
``trainer.deterministic=true`` does in train.py: ``torch.use_deterministic_algorithms`` and the CUBLAS workspace
setting), HF's with ``TrainingArguments(full_determinism=True)``; the row's ``deterministic`` column says which.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from outlierlab.models import EncoderConfig  # noqa: E402
from outlierlab.utils.flops import flops_per_token, mfu, peak_bf16_flops  # noqa: E402

COLUMNS = ["device", "model", "block", "objective", "impl", "compiled", "deterministic", "vocab_multiple",
           "tokens_per_step",
           "tokens_per_s", "mfu", "peak_mem_gb", "torch", "transformers", "lightning", "command"]
SIZES = {"tiny": dict(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128),
         "medium": dict(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=2048),
         "base": dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072)}
VOCAB = 50265  # RoBERTa's tokenizer


def batches(n: int, batch: int, block: int, vocab: int, seed: int = 0) -> list[dict]:
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast


    g = torch.Generator().manual_seed(seed)
    tok = PreTrainedTokenizerFast(tokenizer_object=_dummy_tokenizer(vocab), mask_token="<mask>", pad_token="<pad>")
    collate = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, return_tensors="pt")
    torch.manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, vocab, (batch, block), generator=g)
        ids[:, 0] = 0  # <s>
        out.append({k: v for k, v in collate([{"input_ids": row} for row in ids]).items()})
    return out


def _dummy_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models

    words = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4, **{f"t{i}": i for i in range(5, vocab)}}
    return Tokenizer(models.WordLevel(words, unk_token="<unk>"))


def run_ours(config: EncoderConfig, data: list[dict], args) -> tuple[float, float]:
    import lightning as L

    from outlierlab.lightning_modules.mlm_module import MLMLitModule

    module = MLMLitModule(config, optimizer=_adamw, compile=bool(args.compile), order_use=False)
    timer = _Timer(args.warmup)
    trainer = L.Trainer(accelerator=args.accelerator, devices=1, precision=args.precision, max_steps=len(data),
                        gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[timer], limit_val_batches=0,
                        deterministic=bool(args.deterministic))
    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False, pin_memory=args.accelerator == "gpu")
    trainer.fit(module, train_dataloaders=loader)
    return timer.seconds, _peak_gb()


def _adamw(params, **kw):
    return torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01, **kw)


class _Timer:
    """Wall clock from the end of step ``warmup`` to the end of the last step (device synchronised)."""

    def __new__(cls, warmup: int):
        import lightning as L

        class Timer(L.Callback):
            def __init__(self):
                self.warmup, self.t0, self.seconds = warmup, None, math.nan

            def on_train_batch_end(self, trainer, *a):
                if trainer.global_step == self.warmup:
                    _sync()
                    self.t0 = time.perf_counter()

            def on_train_end(self, trainer, *a):
                _sync()
                self.seconds = time.perf_counter() - self.t0

        return Timer()


def run_hf(config: EncoderConfig, data: list[dict], args) -> tuple[float, float]:
    from transformers import RobertaConfig, RobertaForMaskedLM, Trainer, TrainerCallback, TrainingArguments

    hf = RobertaForMaskedLM(RobertaConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                                          num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
                                          intermediate_size=config.intermediate_size, max_position_embeddings=config.max_len + 2,
                                          type_vocab_size=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                          attn_implementation="sdpa"))
    marks = {}

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if state.global_step == args.warmup:
                _sync()
                marks["t0"] = time.perf_counter()

        def on_train_end(self, a, state, control, **kw):
            _sync()
            marks["t1"] = time.perf_counter()

    gpu = args.accelerator == "gpu"
    targs = TrainingArguments(output_dir=str(Path(args.tmp) / "hf"), per_device_train_batch_size=args.batch,
                              max_steps=len(data), learning_rate=1e-4, adam_beta2=0.98, adam_epsilon=1e-6,
                              weight_decay=0.01, max_grad_norm=1.0, bf16=args.precision.startswith("bf16"),
                              optim="adamw_torch_fused" if gpu else "adamw_torch", torch_compile=bool(args.compile),
                              report_to=[], save_strategy="no", logging_strategy="no", use_cpu=not gpu,
                              dataloader_pin_memory=gpu, disable_tqdm=True, lr_scheduler_type="constant",
                              full_determinism=bool(args.deterministic))
    rows = [{k: v[i] for k, v in b.items()} for b in data for i in range(len(b["input_ids"]))]
    Trainer(model=hf, args=targs, train_dataset=rows, callbacks=[Clock()]).train()
    return marks["t1"] - marks["t0"], _peak_gb()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_gb() -> float:
    if not torch.cuda.is_available():
        return math.nan
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return peak


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(SIZES), default="base")
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--tokens-per-step", type=int, default=32768)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--impl", default="ours,hf")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--deterministic", action="store_true", help="deterministic algorithms only (its cost)")
    p.add_argument("--vocab-multiple", type=int, default=64,
                   help="ours: embedding rows rounded up to a multiple of this (model.vocab_multiple; 1 = none)")
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 4 steps, fp32")
    p.add_argument("--no-write", action="store_true", help="print only (no row in docs/gpu/throughput.csv)")
    p.add_argument("--out", default=str(ROOT / "docs" / "gpu" / "throughput.csv"))
    p.add_argument("--tmp", default=os.environ.get("TMPDIR", "/tmp"))
    args = p.parse_args(argv)
    if args.tiny:
        args.model, args.block, args.tokens_per_step, args.steps, args.warmup = "tiny", 32, 256, 4, 1
    gpu = torch.cuda.is_available() and not args.tiny
    args.accelerator, args.precision = ("gpu", "bf16-mixed") if gpu else ("cpu", "32-true")
    args.batch = max(1, args.tokens_per_step // args.block)
    vocab = 1000 if args.tiny else VOCAB
    config = EncoderConfig(vocab_size=vocab, max_len=args.block, dropout=0.0, attention_dropout=0.0,
                           pos={"name": "learned"}, vocab_multiple=args.vocab_multiple, **SIZES[args.model])
    data = batches(args.steps, args.batch, args.block, vocab)
    device = torch.cuda.get_device_name() if gpu else f"cpu ({platform.processor() or platform.machine()})"
    peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_bf16_flops(device)
    tokens_per_step = args.batch * args.block
    masked = sum(int((b["labels"] != -100).sum()) for b in data) / (len(data) * tokens_per_step)
    f = flops_per_token(config, args.block, masked)
    rows = []
    for impl in args.impl.split(","):
        was = torch.are_deterministic_algorithms_enabled()
        try:
            seconds, mem = {"ours": run_ours, "hf": run_hf}[impl](config, data, args)
        finally:  # both trainers switch it on process-wide and leave it so: the next impl starts as this one did
            torch.use_deterministic_algorithms(was)
        tps = tokens_per_step * (args.steps - args.warmup) / seconds
        rows.append({"device": device, "model": args.model, "block": args.block, "objective": "mlm", "impl": impl,
                     "compiled": bool(args.compile), "deterministic": bool(args.deterministic),
                     "vocab_multiple": args.vocab_multiple if impl == "ours" else 1,  # HF: the tokenizer's size
                     "tokens_per_step": tokens_per_step,
                     "tokens_per_s": round(tps, 1), "mfu": round(mfu(tps, f, peak), 4) if peak else math.nan,
                     "peak_mem_gb": round(mem, 2), "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__,
                     "lightning": __import__("lightning").__version__,
                     "command": "python benchmarks/gpu_throughput.py " + shlex.join(argv if argv is not None else sys.argv[1:])})
        print(f"{impl:5s} {args.model} block {args.block}: {tps:,.0f} tokens/s, MFU {rows[-1]['mfu']}, "
              f"peak {mem:.2f} GB ({seconds:.1f} s for {args.steps - args.warmup} steps)", flush=True)
    if len(rows) == 2:
        print(f"ours / hf: {rows[0]['tokens_per_s'] / rows[1]['tokens_per_s']:.2f}x")
    if not args.no_write:
        append_rows(Path(args.out), rows)
    return rows


def append_rows(out: Path, rows: list[dict]) -> None:
    """``rows`` appended to ``out`` under :data:`COLUMNS` (the header once, when the file is new)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists()
    with open(out, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
