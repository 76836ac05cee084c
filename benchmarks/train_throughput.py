"""Training throughput: our Lightning training step vs a plain PyTorch loop, or train.py variants.

Default mode -- same model (tiny by default), same data (the embedded corpus, packed blocks), same collator
(transformers' DataCollatorForLanguageModeling behind our datamodule), same optimizer, schedule
and gradient clipping. Prints real tokens/s of both, their ratio (goal >= 1.0x), and the
model-FLOPs utilisation (6·N + attention FLOPs per token) against a matmul peak measured here.

    python benchmarks/train_throughput.py [--steps 40] [--model tiny] [--pos learned] [--rounds 2]

``--compare`` mode -- train.py's Lightning step under config variants, interleaved round by round in ONE
process so that background load hits every variant alike; prints tokens/s and optimizer steps/s of each and
its ratio to the first ("eager").  Default variants: eager, ``module.compile=true``, fused and foreach AdamW,
and two batch shapes with the same tokens per step (64x32 and 16x128 against 32x64).  The compiled
variant's compilation happens in its warm-up steps, outside the timing (its cost is printed separately).

    python benchmarks/train_throughput.py --compare --block-size 64 --batch-size 32 --rounds 3
    python benchmarks/train_throughput.py --compare --variant eager= --variant compiled=module.compile=true

``--paired`` mode -- for a LOADED machine: eager and ``torch.compile`` training steps (forward, backward,
clipping, AdamW) of two copies of the same model on the same real batches, alternated step by step, so every
pair of steps sees the same background load; prints the median step time of each, the median of the paired
ratios, and the loss difference (dropout 0, so both compute the same function).

    python benchmarks/train_throughput.py --paired --block-size 64 --batch-size 32 --steps 30 \
        --set model.hidden_size=128 --set model.intermediate_size=512   # experiment=emergence_cpu's model

``--shapes`` mode -- eager steps at 32x64, 64x32 and 16x128 (same tokens per step), alternated likewise.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Before transformers/huggingface_hub are imported: they read the flag at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hydra  # noqa: E402
import lightning as L  # noqa: E402
import torch  # noqa: E402

from outlierlab.datamodules.sampler import ResumableSampler  # noqa: E402
from outlierlab.lightning_modules.callbacks.progress_lines import default_tokens  # noqa: E402
from outlierlab.lightning_modules.mlm_module import MLMLitModule  # noqa: E402 (import cost outside every timing)
from outlierlab.models import RobertaMaskedLM  # noqa: E402
from tests.conftest import compose  # noqa: E402


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
    """Best-of fp32 matmul rate on this machine (the denominator of MFU)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
    return best / 1e9


DEFAULT_VARIANTS = {
    "eager": [],
    "compiled": ["module.compile=true"],
    "adamw_fused": ["+optimizer.fused=true"],
    "adamw_foreach": ["+optimizer.foreach=true"],
    "batch2x_block/2": ["data.batch_size=__2B__", "data.block_size=__L/2__"],
    "batch/2_block2x": ["data.batch_size=__B/2__", "data.block_size=__2L__"],
}


def build(args, extra: list[str] | None = None):
    cfg = compose("train", [f"run_dir={args.run_dir}", f"model={args.model}", f"pos={args.pos}",
                            f"data.batch_size={args.batch_size}", f"data.block_size={args.block_size}",
                            f"trainer.max_steps={args.warmup + args.steps}", "trainer.limit_val_batches=0",
                            *(args.set or []), *(extra or [])])
    dm = hydra.utils.instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    tok = dm.tokenizer
    config = hydra.utils.instantiate(cfg.model, vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    return cfg, dm, config


def plain_loop(cfg, dm, config, warmup: int, steps: int) -> float:
    """The loop a researcher would write by hand (no Lightning)."""
    torch.manual_seed(0)
    module = MLMLitModule(config, hydra.utils.instantiate(cfg.optimizer),
                          hydra.utils.instantiate(cfg.module.scheduler))
    model = module.model.train()
    opt_cfg = module.configure_optimizers()
    opt, sched = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
    loader = dm._loader(dm.train_dataset, __import__("outlierlab.datamodules.sampler", fromlist=["ResumableSampler"])
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


def lightning_loop(cfg, dm, config, warmup: int, steps: int, callbacks: bool, timer_out: dict | None = None) -> float:
    class Timer(L.Callback):
        tokens, t0 = 0, None

        def on_train_start(self, trainer, pl_module):
            self.t_start = time.perf_counter()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == warmup:
                self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.t0 is not None:
                self.tokens += default_tokens(batch)
                self.t1 = time.perf_counter()

    torch.manual_seed(0)
    module = hydra.utils.instantiate(cfg.module, model=config)
    timer = Timer()
    cbs, loggers = [timer], False
    if callbacks:  # what train.py runs: its callbacks and its loggers (the LR monitor needs one)
        cbs += [hydra.utils.instantiate(c) for c in cfg.callbacks.values() if c is not None]
        loggers = [hydra.utils.instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=cbs, logger=loggers, enable_checkpointing=callbacks,
                                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    if timer_out is not None:  # warm-up wall time (compilation, for a compiled module) and steps/s
        timer_out.update(warmup_s=timer.t0 - timer.t_start, steps_per_s=steps / (timer.t1 - timer.t0))
    return timer.tokens / (timer.t1 - timer.t0)


def _expand(overrides: list[str], batch: int, block: int) -> list[str]:
    """Fill the shape placeholders of DEFAULT_VARIANTS from --batch-size/--block-size."""
    subs = {"__2B__": 2 * batch, "__B/2__": max(1, batch // 2), "__2L__": 2 * block, "__L/2__": max(2, block // 2)}
    out = []
    for o in overrides:
        for k, v in subs.items():
            o = o.replace(k, str(v))
        out.append(o)
    return out


def paired(args) -> None:
    """Eager vs compiled training steps, alternated step by step on the same batches (see module docstring)."""
    cfg, dm, config = build(args, ["model.dropout=0.0", "model.attention_dropout=0.0"])
    torch.manual_seed(0)
    eager = RobertaMaskedLM(config).train()
    compiled_model = copy.deepcopy(eager)
    step_fn = {"eager": eager, "compiled": torch.compile(compiled_model.forward)}
    models = {"eager": eager, "compiled": compiled_model}
    opts = {n: torch.optim.AdamW(m.parameters(), lr=float(cfg.optimizer.lr), betas=(0.9, 0.98), eps=1e-6,
                                 weight_decay=0.01) for n, m in models.items()}
    loader = dm._loader(dm.train_dataset, ResumableSampler(len(dm.train_dataset), dm.batch_size, shuffle=True, seed=0))
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    losses: dict[str, list[float]] = {"eager": [], "compiled": []}
    compile_s = 0.0
    for i, batch in enumerate(loader):
        if i == args.warmup + args.steps:
            break
        order = ("eager", "compiled") if i % 2 == 0 else ("compiled", "eager")  # no first-mover bias
        for name in order:
            t = time.perf_counter()
            loss = step_fn[name](batch["input_ids"], batch["attention_mask"], batch["labels"]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(models[name].parameters(), 1.0)
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            dt = time.perf_counter() - t
            losses[name].append(float(loss))
            if i >= args.warmup:
                times[name].append(dt)
            elif name == "compiled":
                compile_s += dt
        if i >= args.warmup:
            print(f"  step {i}: eager {times['eager'][-1] * 1e3:7.0f} ms  compiled {times['compiled'][-1] * 1e3:7.0f} ms",
                  flush=True)
    ratios = [e / c for e, c in zip(times["eager"], times["compiled"])]
    med_e, med_c = statistics.median(times["eager"]), statistics.median(times["compiled"])
    diff = max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"]))
    print(f"\nmodel {args.model} ({config.num_layers}x{config.hidden_size}) pos={args.pos}, batch "
          f"{args.batch_size}x{args.block_size}, {len(ratios)} paired steps after {args.warmup} warm-up "
          f"(compilation + warm-up {compile_s:.0f} s), {torch.get_num_threads()} threads")
    print(f"eager    median step {med_e * 1e3:8.0f} ms")
    print(f"compiled median step {med_c * 1e3:8.0f} ms")
    print(f"speed-up compiled/eager: {med_e / med_c:.2f}x (ratio of medians), {statistics.median(ratios):.2f}x "
          f"(median of paired ratios; quartiles {statistics.quantiles(ratios, n=4)[0]:.2f}-"
          f"{statistics.quantiles(ratios, n=4)[2]:.2f})")
    print(f"largest loss difference over {len(losses['eager'])} steps: {diff:.2e}")


def shapes(args) -> None:
    """Tokens/s of eager training steps at batch shapes with the same tokens per step, alternated step by
    step (base: --batch-size x --block-size; then 2x batch / half block and half batch / 2x block)."""
    b, l = args.batch_size, args.block_size
    runs = {}
    for bs, bl in ((b, l), (2 * b, l // 2), (b // 2, 2 * l)):
        cfg, dm, config = build(args, [f"data.batch_size={bs}", f"data.block_size={bl}", f"model.max_len={max(bl, 2)}"])
        torch.manual_seed(0)
        model = RobertaMaskedLM(config).train()
        opt = torch.optim.AdamW(model.parameters(), lr=float(cfg.optimizer.lr), betas=(0.9, 0.98), eps=1e-6)
        loader = iter(dm._loader(dm.train_dataset, ResumableSampler(len(dm.train_dataset), bs, shuffle=True, seed=0)))
        runs[f"{bs}x{bl}"] = (model, opt, loader)
    tps: dict[str, list[float]] = {n: [] for n in runs}
    for i in range(args.warmup + args.steps):
        for name, (model, opt, loader) in runs.items():
            batch = next(loader)
            t = time.perf_counter()
            model(batch["input_ids"], batch["attention_mask"], batch["labels"]).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= args.warmup:
                tps[name].append(int(batch["attention_mask"].sum()) / (time.perf_counter() - t))
    base = statistics.median(tps[next(iter(tps))])
    print(f"\nmodel {args.model}, eager, {args.steps} steps per shape alternated, {torch.get_num_threads()} threads")
    for name, ts in tps.items():
        print(f"batch x block {name:8s} {statistics.median(ts):8.0f} tokens/s  {statistics.median(ts) / base:5.2f}x")


def compare(args) -> None:
    """Interleave config variants of train.py's step round by round; print each one's ratio to the first."""
    variants = DEFAULT_VARIANTS
    if args.variant:
        variants = {}
        for spec in args.variant:
            name, _, rest = spec.partition("=")
            variants[name] = [o for o in rest.split(",") if o] if rest else []
    built = {}
    for name, overrides in variants.items():
        extra = _expand(overrides, args.batch_size, args.block_size)
        cfg, dm, config = build(args, extra)
        if dm.block_size > config.max_len:
            config.max_len = dm.block_size
        built[name] = (cfg, dm, config, extra)
    tps: dict[str, list[float]] = {n: [] for n in built}
    sps: dict[str, list[float]] = {n: [] for n in built}
    warm: dict[str, list[float]] = {n: [] for n in built}
    for r in range(args.rounds):
        for name, (cfg, dm, config, _) in built.items():
            info: dict = {}
            tps[name].append(lightning_loop(cfg, dm, config, args.warmup, args.steps, False, info))
            sps[name].append(info["steps_per_s"])
            warm[name].append(info["warmup_s"])
            torch._dynamo.reset()  # every compiled round pays (and reports) its own compilation
            print(f"  round {r + 1} {name:18s} {tps[name][-1]:8.0f} tokens/s  {sps[name][-1]:6.2f} steps/s "
                  f"(warm-up {warm[name][-1]:.1f} s)", flush=True)
    base = next(iter(built))
    b_t, b_s = max(tps[base]), max(sps[base])
    print(f"\nmodel {args.model} pos={args.pos}, base shape {args.batch_size}x{args.block_size}, "
          f"{args.steps} timed steps after {args.warmup} warm-up, best of {args.rounds} interleaved rounds, "
          f"{torch.get_num_threads()} threads")
    print(f"{'variant':18s} {'tokens/s':>9s} {'ratio':>6s} {'steps/s':>8s} {'ratio':>6s} {'warm-up s':>9s}  overrides")
    for name in built:
        t, s_ = max(tps[name]), max(sps[name])
        print(f"{name:18s} {t:9.0f} {t / b_t:6.2f} {s_:8.2f} {s_ / b_s:6.2f} {min(warm[name]):9.1f}  "
              f"{' '.join(built[name][3]) or '-'}")


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
    p.add_argument("--compare", action="store_true", help="compare train.py config variants (see module docstring)")
    p.add_argument("--variant", action="append", help="NAME=override1,override2 (repeatable; first is the base)")
    p.add_argument("--set", action="append", help="extra train.py override for every variant, e.g. model.hidden_size=128")
    p.add_argument("--shapes", action="store_true", help="batch shapes with equal tokens per step, alternated")
    p.add_argument("--paired", action="store_true", help="eager vs compiled, alternated step by step (loaded machine)")
    args = p.parse_args()
    if args.compare:
        compare(args)
        return
    if args.paired:
        paired(args)
        return
    if args.shapes:
        shapes(args)
        return

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    peak = matmul_peak_gflops()
    cfg, dm, config = build(args)
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
