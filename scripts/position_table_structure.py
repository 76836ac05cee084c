"""When does a learned position table get structure, against when the model starts to use order (docs/order_use.md)?

    python scripts/position_table_structure.py runs/cpu_preln_b128_learned --out docs/order_use/position_table.csv

Per checkpoint ``checkpoints/step*.ckpt`` of each run: the table rows the run's blocks use (rows after RoBERTa's
padding offset: token t reads row ``pad_token_id + 1 + t``; ``data.block_size`` of them), their mean L2 norm, and the cosine between rows ``k`` positions apart
after the mean row is removed (a shared offset would make every pair look alike), averaged over the pairs: ``k`` = 1,
2, 4, and 16-39 ("far").  A table with no order in it has cosine ~0 at every offset; a smooth table has high
cosine at small offsets and negative far away.  Beside them, the run's ``val/order_use`` and per-layer
attention locality at the same step (``csv/metrics.csv``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import json

import pandas as pd
import torch
from omegaconf import OmegaConf

from outlierlab.utils.tables import md_table

SUFFIX = "embeddings.position_embeddings.weight"


def offset_cosine(table: torch.Tensor, offsets) -> float:
    x = torch.nn.functional.normalize(table - table.mean(0), dim=1)
    c = x @ x.T
    return float(torch.stack([torch.diagonal(c, k).mean() for k in offsets]).mean())


def rows(run: Path) -> list[dict]:
    pad = int(json.loads((run / "model" / "config.json").read_text())["pad_token_id"])  # the exported model's
    block = int(OmegaConf.load(run / "config.yaml").data.block_size)
    metrics = pd.read_csv(run / "csv" / "metrics.csv")
    val = metrics.dropna(subset=["val/order_use"]).set_index("step")
    out = []
    for ckpt in sorted((run / "checkpoints").glob("step*.ckpt")):
        sd = torch.load(ckpt, map_location="cpu", weights_only=False)
        step = int(sd["global_step"])
        table = next(v for k, v in sd["state_dict"].items() if k.endswith(SUFFIX)).float()[pad + 1:pad + 1 + block]
        row = {"run": run.name, "step": step, "table_norm": float(table.norm(dim=1).mean()),
               "cos_offset_1": offset_cosine(table, [1]), "cos_offset_2": offset_cosine(table, [2]),
               "cos_offset_4": offset_cosine(table, [4]), "cos_far": offset_cosine(table, range(16, 40))}
        if step - 1 in val.index:  # Lightning logs a validation at the step index before the increment
            v = val.loc[step - 1]
            row["val/order_use"] = float(v["val/order_use"])
            row.update({c: float(v[c]) for c in val.columns if c.startswith("val/attn_local/")})
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    table = pd.DataFrame([r for run in a.runs for r in rows(run)])
    table.to_csv(a.out, index=False, float_format="%.4g")
    cols = ["run", "step", "table_norm", "cos_offset_1", "cos_offset_2", "cos_offset_4", "cos_far", "val/order_use",
            *[c for c in table.columns if c.startswith("val/attn_local/")]]
    print(md_table(cols, [[f"{v:.3f}" if isinstance(v, float) else v for v in r] for r in table[cols].itertuples(index=False)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
