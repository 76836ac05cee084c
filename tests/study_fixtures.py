"""Shared helpers of the study tests: cells planted by hand (a run directory's files with chosen values) and a study
of them, and one row of an aggregated table."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

def plant_cell(root: Path, overrides: dict, values: dict[int, dict[str, float]], *, finished: bool = True,
               max_steps: int = 100, extra_config: dict | None = None) -> Path:
    """A train.py-like run directory: overrides, resolved config, live monitor history, val/ppl."""
    name = ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    cell = root / name
    (cell / ".hydra").mkdir(parents=True)
    (cell / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"{k}={v}" for k, v in overrides.items()]))
    config = {"seed": overrides.get("seed", 0), "run_dir": str(cell), "pos": {"name": overrides.get("pos", "learned")},
              "trainer": {"max_steps": max_steps}, **(extra_config or {})}
    (cell / "config.yaml").write_text(yaml.safe_dump(config))
    rows = ["step,name,statistic,dim,value"]
    for step, stats in values.items():
        for layer, v in (("layer_1", stats["kurtosis"] / 2), ("layer_2", stats["kurtosis"])):
            rows.append(f"{step},{layer},kurtosis,,{v}")
        rows.append(f"{step},layer_2,argmax_share,17,{stats['share']}")
        rows += [f"{step},layer_2,mean,{d},{d * 0.1}" for d in range(3)]  # a vector: not aggregated
    (cell / "monitor").mkdir()
    (cell / "monitor" / "hidden_states.csv").write_text("\n".join(rows) + "\n")
    (cell / "csv").mkdir()
    (cell / "csv" / "metrics.csv").write_text("epoch,global_step,step,val/ppl,train/loss,lr-AdamW\n0,,50,,3.0,0.1\n"
                                              f",100,100,{values[max(values)]['ppl']},,\n")
    (cell / "checkpoints").mkdir()
    if finished:
        (cell / "finished.json").write_text(json.dumps({"global_step": max_steps, "max_steps": max_steps}))
    return cell


LEARNED = {1: 2.0, 2: 4.0, 3: 9.0}   # final kurtosis per seed


NONE = {1: 1.0, 2: 1.5, 3: 2.0}


def plant_study(root: Path) -> Path:
    for pos, finals in (("learned", LEARNED), ("none", NONE)):
        for seed, k in finals.items():
            plant_cell(root, {"pos": pos, "seed": seed, "experiment": "emergence_seeds"},
                       {0: {"kurtosis": 1.0, "share": 0.1, "ppl": 900.0},
                        100: {"kurtosis": k, "share": 0.2 * seed, "ppl": 300.0 + seed}})
    return root


def row(df: pd.DataFrame, **where) -> pd.Series:
    sub = df
    for k, v in where.items():
        sub = sub[sub[k] == v]
    assert len(sub) == 1, where
    return sub.iloc[0]
