"""AdamW step time on CPU: the default for-loop implementation vs ``foreach=True`` vs ``fused=True``.

The optimizer step is the part of a training step that the implementation choice changes; timing it alone
(interleaved, median of many repeats) gives a ratio that background load affects far less than whole
training runs do.  Its share of a step (printed against a measured forward+backward) says what the ratio is
worth in steps per hour.  Enable a winner with ``+optimizer.fused=true`` (or ``foreach``).

    python benchmarks/optimizer_step.py [--hidden 128 --layers 4 --vocab 8192] [--repeats 50]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from outlierlab.models import EncoderConfig, RobertaMaskedLM  # noqa: E402

VARIANTS = {"for-loop (default on CPU)": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                           num_heads=max(1, args.hidden // 32), intermediate_size=4 * args.hidden, max_len=args.block)
    model = RobertaMaskedLM(config)
    params = list(model.parameters())
    # one real forward+backward: the step time the optimizer's share is measured against
    ids = torch.randint(5, args.vocab, (args.batch, args.block))
    labels = torch.where(torch.rand(ids.shape) < 0.15, ids, -100)
    fb = []
    for _ in range(5):
        t = time.perf_counter()
        model(ids, torch.ones_like(ids), labels).loss.backward()
        fb.append(time.perf_counter() - t)
    grads = [p.grad.clone() for p in params]
    opts = {}
    for name, kw in VARIANTS.items():
        copies = [p.detach().clone().requires_grad_(True) for p in params]
        for c, g in zip(copies, grads):
            c.grad = g.clone()
        opts[name] = torch.optim.AdamW(copies, lr=1e-3, weight_decay=0.01, **kw)
        opts[name].step()  # allocate state outside the timing
    times = {n: [] for n in opts}
    for _ in range(args.repeats):  # interleaved, so load drifts hit every variant alike
        for name, opt in opts.items():
            t = time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - t)
    n_params = sum(p.numel() for p in params)
    base = statistics.median(times[next(iter(times))])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {n_params / 1e6:.2f}M parameters in "
          f"{len(params)} tensors; forward+backward of {args.batch}x{args.block}: {statistics.median(fb) * 1e3:.0f} ms")
    print(f"{'AdamW':28s} {'median ms':>9s} {'speed-up':>8s} {'share of step':>13s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:28s} {med * 1e3:9.2f} {base / med:8.2f} {med / (med + statistics.median(fb)):13.1%}")


if __name__ == "__main__":
    main()
