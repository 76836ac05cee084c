"""Training throughput: our Lightning training step vs a plain PyTorch loop.

Same model (tiny by default), same data (the embedded corpus, packed blocks), same collator
(transformers' DataCollatorForLanguageModeling behind our datamodule), same optimizer, schedule
and gradient clipping. Prints real tokens/s of both, their ratio (goal >= 1.0x), and the
model-FLOPs utilisation (6·N + attention FLOPs per token) against a matmul peak measured here.

    python benchmarks/train_throughput.py [--steps 40] [--model tiny] [--pos learned] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
    """Best-of fp32 matmul rate on this machine (the denominator of MFU)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
    return best / 1e9


def build(args):
    import hydra

    from tests.conftest import compose

    cfg = compose("train", [f"run_dir={args.run_dir}", f"model={args.model}", f"pos={args.pos}",
                            f"data.batch_size={args.batch_size}", f"data.block_size={args.block_size}",
                            f"trainer.max_steps={args.warmup + args.steps}", "trainer.limit_val_batches=0"])
    dm = hydra.utils.instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    tok = dm.tokenizer
    config = hydra.utils.instantiate(cfg.model, vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    return cfg, dm, config


def plain_loop(cfg, dm, config, warmup: int, steps: int) -> float:
    """The loop a researcher would write by hand (no Lightning)."""
    import hydra
    import torch

    from lightning_modules.mlm_module import MLMLitModule

    torch.manual_seed(0)
    module = MLMLitModule(config, hydra.utils.instantiate(cfg.module.optimizer),
                          hydra.utils.instantiate(cfg.module.scheduler))
    model = module.model.train()
    opt_cfg = module.configure_optimizers()
    opt, sched = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
    loader = dm._loader(dm.train_dataset, __import__("datamodules.sampler", fromlist=["ResumableSampler"])
                        .ResumableSampler(len(dm.train_dataset), dm.batch_size, shuffle=True, seed=0))
    tokens, t0 = 0, None
    for i, batch in enumerate(loader):
        if i == warmup:
            t0 = time.perf_counter()
        loss = model(batch["input_ids"], batch["attention_mask"], batch["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.gradient_clip_val)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            tokens += int(batch["attention_mask"].sum())
        if i + 1 == warmup + steps:
            break
    return tokens / (time.perf_counter() - t0)


def lightning_loop(cfg, dm, config, warmup: int, steps: int, callbacks: bool) -> float:
    import hydra
    import lightning as L
    import torch

    class Timer(L.Callback):
        tokens, t0 = 0, None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == warmup:
                self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.t0 is not None:
                self.tokens += int(batch["attention_mask"].sum())
                self.t1 = time.perf_counter()

    torch.manual_seed(0)
    module = hydra.utils.instantiate(cfg.module, model=config)
    timer = Timer()
    cbs = [timer]
    if callbacks:
        cbs += [hydra.utils.instantiate(c) for c in cfg.callbacks.values() if c is not None]
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=cbs, logger=False, enable_checkpointing=callbacks,
                                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    return timer.tokens / (timer.t1 - timer.t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--pos", default="learned")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="alternate plain/Lightning this many times; best of each")
    p.add_argument("--with-callbacks", action="store_true", help="Lightning with the default callbacks (monitors, checkpoints)")
    p.add_argument("--run-dir", default="/tmp/outlierlab_bench_train")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from lightning_modules.mlm_module import MLMLitModule  # noqa: F401 (import cost outside timing)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    peak = matmul_peak_gflops()
    cfg, dm, config = build(args)
    from models import RobertaMaskedLM

    n_params = sum(p.numel() for p in RobertaMaskedLM(config).parameters())
    flops_per_token = 6 * n_params + 12 * config.num_layers * args.block_size * config.hidden_size
    plain, light = [], []
    for _ in range(args.rounds):
        plain.append(plain_loop(cfg, dm, config, args.warmup, args.steps))
        light.append(lightning_loop(cfg, dm, config, args.warmup, args.steps, args.with_callbacks))
    best_p, best_l = max(plain), max(light)
    print(f"model {args.model} pos={args.pos}: {n_params/1e6:.1f}M params, batch {args.batch_size}x{args.block_size}")
    print(f"matmul peak (fp32, measured)   : {peak:8.1f} GFLOP/s")
    print(f"plain PyTorch loop             : {best_p:8.0f} tokens/s   (rounds: {', '.join(f'{x:.0f}' for x in plain)})")
    print(f"Lightning (train.py)           : {best_l:8.0f} tokens/s   (rounds: {', '.join(f'{x:.0f}' for x in light)})"
          + ("  [with default callbacks]" if args.with_callbacks else ""))
    print(f"ratio Lightning / plain        : {best_l / best_p:8.2f}x")
    print(f"MFU (Lightning) vs matmul peak : {best_l * flops_per_token / (peak * 1e9):8.1%}")


if __name__ == "__main__":
    main()
