"""Our training step vs Hugging Face's ``RobertaForMaskedLM`` (SDPA attention) of the same configuration, and our
step before vs after the masked-position LM head.

Three training steps (forward, loss, backward, gradient clipping 1.0, AdamW) on the SAME real batches (embedded
corpus, our packed blocks and seeded 15 % masking), alternated step by step in one process so that background
load hits all of them alike:

* ``ours``      -- ``RobertaMaskedLM`` as ``train.py`` runs it: the head only at the masked positions, the
                   all-ones attention mask dropped on the host (``MLMLitModule.on_before_batch_transfer``);
* ``ours_full`` -- the older step: the head on every position (``full_logits=True``), mask passed;
* ``hf``        -- ``transformers.RobertaForMaskedLM(attn_implementation="sdpa")`` with the same sizes, given
                   the collator's ``input_ids, attention_mask, labels`` as a user would.

Prints per variant the median step time, tokens/s, the median of the per-step time ratios to ``ours`` with
quartiles, and MFU = tokens/s x F / peak, with F = 6·N + 12·L·T·d FLOPs per token (N all parameters, Kaplan
et al. 2020, plus attention scores and values; the same F for every variant, so MFU ratios are throughput
ratios) and the peak the best fp32 2048² matmul rate measured in the same run (on a loaded machine both fall).
The masked head executes fewer FLOPs than F assumes: HFU counts what each variant executes, F minus
6·(1 − m)·(d² + d·V) per token for ``ours`` (m the share of masked tokens: the head's dense layer and vocabulary
projection run on masked tokens only).

    python benchmarks/train_vs_hf.py --preset tiny --steps 30
    python benchmarks/train_vs_hf.py --preset emergence_cpu --steps 30
    python benchmarks/train_vs_hf.py --preset base --steps 4 --batch-size 8
    python benchmarks/train_vs_hf.py --objective clm --preset emergence_cpu --steps 30

With ``--objective clm`` the variants are our causal step (``objective=clm``: fused causal attention,
shifted next-token loss) against transformers' ``RobertaForCausalLM`` (``is_decoder``; the exact twin: the same
function, tested in tests/test_causal_lm.py) and ``GPT2LMHeadModel`` of the same sizes (pre-LN, its own head: a
different function of the same cost class), all on the same unmasked blocks with labels = inputs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hydra  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, RobertaConfig, RobertaForCausalLM, RobertaForMaskedLM  # noqa: E402

from benchmarks.train_throughput import matmul_peak_gflops  # noqa: E402
from outlierlab.datamodules.sampler import ResumableSampler  # noqa: E402
from outlierlab.lightning_modules.mlm_module import prepare_mlm_batch  # noqa: E402
from outlierlab.models import RobertaMaskedLM  # noqa: E402
from tests.conftest import compose  # noqa: E402

PRESETS = {
    "tiny": ["model=tiny"],
    "emergence_cpu": ["experiment=emergence_cpu"],
    "base": ["model=base", "data.batch_size=8"],
}


def hf_twin(config) -> RobertaForMaskedLM | RobertaForCausalLM:
    """HF RoBERTa of our configuration (learned positions: max_len + 2 rows, one token type); the causal-LM class
    with ``is_decoder`` for a causal config."""
    hf = RobertaConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                       num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
                       intermediate_size=config.intermediate_size, max_position_embeddings=config.max_len + 2,
                       hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.attention_dropout,
                       type_vocab_size=1, layer_norm_eps=config.layer_norm_eps, pad_token_id=config.pad_token_id,
                       is_decoder=bool(config.causal), attn_implementation="sdpa")
    return RobertaForCausalLM(hf) if config.causal else RobertaForMaskedLM(hf)


def gpt2_twin(config) -> GPT2LMHeadModel:
    """GPT-2 of the same width, depth, heads, FFN and context (SDPA attention)."""
    return GPT2LMHeadModel(GPT2Config(vocab_size=config.vocab_size, n_positions=config.max_len, n_embd=config.hidden_size,
                                      n_layer=config.num_layers, n_head=config.num_heads, n_inner=config.intermediate_size,
                                      resid_pdrop=config.dropout, embd_pdrop=config.dropout,
                                      attn_pdrop=config.attention_dropout, attn_implementation="sdpa"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="emergence_cpu")
    p.add_argument("--objective", choices=("mlm", "clm"), default="mlm")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--run-dir", default="/tmp/outlierlab_bench")
    p.add_argument("--device", default="cpu", help="cpu or cuda (batches move after the host-side preparation)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's peak for MFU (e.g. 989 for an H100's dense bf16); default: a measured fp32 matmul")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = [f"run_dir={args.run_dir}", *PRESETS[args.preset], "trainer.limit_val_batches=0",
                 f"objective={args.objective}"]
    if args.batch_size:
        overrides.append(f"data.batch_size={args.batch_size}")
    cfg = compose("train", overrides)
    dm = hydra.utils.instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    tok = dm.tokenizer
    config = hydra.utils.instantiate(cfg.model, vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    causal = bool(config.causal)
    if causal:
        models = {"ours": RobertaMaskedLM(config), "hf": hf_twin(config), "gpt2": gpt2_twin(config)}
    else:
        models = {"ours": RobertaMaskedLM(config), "ours_full": RobertaMaskedLM(config), "hf": hf_twin(config)}
    device = torch.device(args.device)
    for m in models.values():
        m.to(device).train()
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    n_params = sum(p.numel() for p in models["ours"].parameters())
    T, d, L = dm.block_size, config.hidden_size, config.num_layers
    flops_per_token = 6 * n_params + 12 * L * T * d

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(name, batch):
        m = models[name]
        if name == "ours":
            b = {k: v.to(device, non_blocking=True) for k, v in prepare_mlm_batch(batch, causal=causal).items()}
            loss = m(b["input_ids"], b.get("attention_mask"), b["labels"], masked_positions=b.get("masked_positions")).loss
        elif name == "ours_full":
            loss = m(batch["input_ids"], batch["attention_mask"], batch["labels"], full_logits=True).loss
        else:
            loss = m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)

    loader = dm._loader(dm.train_dataset, ResumableSampler(len(dm.train_dataset), dm.batch_size, seed=0))
    times = {k: [] for k in models}
    tokens, masked = [], []
    order = list(models)
    for i, batch in enumerate(loader):
        if i == args.warmup + args.steps:
            break
        if batch["input_ids"].shape[0] < dm.batch_size:
            continue
        on_device = {k: v.to(device) for k, v in batch.items()}
        for name in (order if i % 2 == 0 else order[::-1]):  # alternate who goes first
            sync()
            t = time.perf_counter()
            step(name, batch if name == "ours" else on_device)
            sync()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t)
        if i >= args.warmup:
            tokens.append(int(batch["attention_mask"].sum()))
            masked.append(int((batch["labels"] != -100).sum()))
    # measured after the steps, in the same process and load
    peak = args.peak_tflops * 1e12 if args.peak_tflops else matmul_peak_gflops() * 1e9
    tok_step = statistics.mean(tokens)
    print(f"objective {args.objective}, preset {args.preset}: {L} layers x {d} hidden, block {T}, batch {dm.batch_size}, vocab {config.vocab_size}, "
          f"{n_params / 1e6:.2f}M parameters, {torch.get_num_threads()} thread(s), {len(tokens)} paired steps")
    print(f"F = 6N + 12LTd = {flops_per_token / 1e6:.1f} MFLOP/token; fp32 matmul peak {peak / 1e9:.0f} GFLOP/s")
    m = statistics.mean(masked) / tok_step
    head = 6 * (1 - m) * (d * d + d * config.vocab_size)
    if causal:  # every position is predicted: each variant executes F
        executed = dict.fromkeys(models, flops_per_token)
        print(f"objective clm: every position predicted; labels = inputs ({m:.3f} of the tokens labelled)")
    else:
        executed = {"ours": flops_per_token - head, "ours_full": flops_per_token, "hf": flops_per_token}
        print(f"masked share m = {m:.3f}; ours executes {executed['ours'] / 1e6:.1f} MFLOP/token")
    print(f"{'variant':<10} {'median s/step':>13} {'tokens/s':>10} {'ours is x faster (median, q1-q3)':>34} "
          f"{'MFU':>6} {'HFU':>6}")
    for name in order:
        med = statistics.median(times[name])
        ratios = sorted(a / b for a, b in zip(times[name], times["ours"]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        tps = tok_step / med
        print(f"{name:<10} {med:>13.4f} {tps:>10,.0f} {statistics.median(ratios):>20.2f}x ({q[0]:.2f}-{q[2]:.2f})"
              f" {100 * tps * flops_per_token / peak:>5.1f}% {100 * tps * executed[name] / peak:>5.1f}%")


if __name__ == "__main__":
    main()
