"""Is the learned position table's gradient noise-dominated while a masked LM sits in the bag-of-words plateau?

    python scripts/position_gradient_noise.py RUN_DIR... --init --batches 256 --batch-size 32 --parts 0,1 \
        --out docs/order_use/gradient_noise.csv
    python scripts/position_gradient_noise.py --table docs/order_use/gradient_noise.csv    # the table in the docs

For each checkpoint ``checkpoints/step*.ckpt`` of each run (and with ``--init`` its initialisation): K gradients of training batches of B blocks (the run's
own data and masking; the same K batches at every checkpoint), and per parameter group the simple noise
scale ``B_simple = tr(Σ) / |G|²`` (:mod:`outlierlab.metrics.gradient_noise`, McCandlish et al. 2018): the batch size
at which signal equals noise. ``snr_b32`` / ``snr_b128`` = b / B_simple: the signal-to-noise of a batch gradient at
emergence_cpu's batch (32, the plateau lasts ~15,000 steps) and order_recipe's (128, it ends by ~3,000). Groups: the
position table (the rows the blocks use), the token embeddings, the attention query/key weights (the path through
which position-position attention is learned), and every other parameter. Beside them the run's ``val/order_use``
at that step (``csv/metrics.csv``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import hydra
import lightning as L
import pandas as pd
import torch
from omegaconf import OmegaConf

from outlierlab.metrics.gradient_noise import NoiseScale
from outlierlab.configuration.composing import register_resolvers
from outlierlab.utils.tables import md_table


def group_of(name: str) -> str:
    if name.endswith("embeddings.position_embeddings.weight"):
        return "position table"
    if name.endswith("embeddings.word_embeddings.weight"):
        return "token embeddings"
    if ".attention.self.query." in name or ".attention.self.key." in name:
        return "attention query/key"
    return "other"


def batches(cfg, k: int, batch_size: int, part: int) -> tuple[list[dict], object]:
    """Training batches ``part·K .. (part+1)·K - 1`` in the loader's order, as the trainer would see them (the
    datamodule seeds its shuffling and masking from the run's seed, so each part is a disjoint, fixed set: the same
    batches at every checkpoint)."""
    datamodule = hydra.utils.instantiate(cfg.data, batch_size=batch_size)
    datamodule.prepare_data()
    datamodule.setup("fit")
    out = []
    for i, batch in enumerate(datamodule.train_dataloader()):
        if i >= part * k:
            out.append(batch)
        if len(out) == k:
            return out, datamodule.tokenizer
    raise ValueError(f"the training split gives fewer than {(part + 1) * k} batches of {batch_size} (--batches {k}, "
                     f"part {part})")


def states(run: Path, module, with_init: bool):
    """``(step, state_dict)``: the initialisation (``--init``: drawn as train.py draws it, seed = the run's), then
    every ``checkpoints/step*.ckpt``."""
    if with_init:
        yield 0, {k: v.clone() for k, v in module.state_dict().items()}
    for ckpt in sorted((run / "checkpoints").glob("step*.ckpt")):
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        yield int(state["global_step"]), state["state_dict"]


def noise_rows(run: Path, k: int, batch_size: int | None, part: int, with_init: bool = False) -> list[dict]:
    register_resolvers()
    cfg = OmegaConf.load(run / "config.yaml")
    b = int(batch_size or cfg.data.batch_size)
    data, tokenizer = batches(cfg, k, b, part)
    config = hydra.utils.instantiate(
        cfg.model, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id,
        eos_token_id=tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id)
    L.seed_everything(int(cfg.seed), verbose=False)
    module = hydra.utils.instantiate(cfg.module, model=config)
    metrics = pd.read_csv(run / "csv" / "metrics.csv")
    val = metrics.dropna(subset=["val/order_use"]).set_index("step") if "val/order_use" in metrics else pd.DataFrame()
    rows = []
    for step, state in states(run, module, with_init):
        module.load_state_dict(state)
        module.train()  # dropout as in training: the noise the optimizer sees
        params = [(n, p) for n, p in module.model.named_parameters() if p.requires_grad]
        scales = {g: NoiseScale(b) for g in dict.fromkeys(group_of(n) for n, _ in params)}
        L.seed_everything(part, verbose=False)  # dropout, if the recipe has any: the same at every checkpoint
        for batch in data:
            batch = module.on_before_batch_transfer(dict(batch), 0)
            loss = module.model(batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                                masked_positions=batch.get("masked_positions")).loss
            grads = torch.autograd.grad(loss, [p for _, p in params])
            by_group: dict[str, list[torch.Tensor]] = {}
            for (n, _), g in zip(params, grads):
                by_group.setdefault(group_of(n), []).append(g.reshape(-1))
            for group, parts in by_group.items():
                scales[group].update(torch.cat(parts))
        order_use = float(val.loc[step - 1, "val/order_use"]) if step - 1 in val.index else float("nan")
        for group, ns in scales.items():
            r = ns.result()
            rows.append({"run": run.name, "part": part, "step": step, "group": group, **r, "snr_b32": 32 / r["b_simple"],
                         "snr_b128": 128 / r["b_simple"], "val/order_use": order_use})
        print(f"{run.name} step {step}: " + ", ".join(f"{g} {s.result()['b_simple']:.3g}" for g, s in scales.items()),
              file=sys.stderr)
    return rows


def pivot(table: pd.DataFrame) -> str:
    """One row per run x step, one column per group: B_simple of each part ("689 / 697"), then order use."""
    groups = list(dict.fromkeys(table["group"]))
    body = []
    for (run, step), sub in table.groupby(["run", "step"], sort=False):
        cells = [" / ".join(f"{v:.3g}" for v in sub[sub["group"] == g].sort_values("part")["b_simple"]) for g in groups]
        body.append([run, step, *cells, f"{sub['val/order_use'].iloc[0]:.3f}"])
    return md_table(["run", "step", *(f"B_simple, {g}" for g in groups), "order use"], body, cell=str)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, help="the CSV to write")
    ap.add_argument("--table", type=Path, help="print the table of an existing CSV (no runs needed)")
    ap.add_argument("--batches", type=int, default=64, help="K batch gradients per checkpoint")
    ap.add_argument("--batch-size", type=int, default=None, help="B (default: the run's data.batch_size)")
    ap.add_argument("--parts", default="0", help="comma-separated disjoint sets of K training batches (part p: "
                    "batches p*K .. (p+1)*K-1): the spread between parts is the estimate's own noise")
    ap.add_argument("--init", action="store_true", help="also the initialisation (step 0), seeded like the run")
    a = ap.parse_args()
    if a.table:
        print(pivot(pd.read_csv(a.table)))
        return 0
    if not a.runs or not a.out:
        ap.error("give run directories and --out (or --table CSV)")
    parts = [int(x) for x in a.parts.split(",") if x]
    table = pd.DataFrame([r for run in a.runs for part in parts
                          for r in noise_rows(run, a.batches, a.batch_size, part, a.init)])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(a.out, index=False, float_format="%.4g")
    print(pivot(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
