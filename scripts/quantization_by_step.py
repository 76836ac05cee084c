"""What 8 bits cost each run at chosen steps: evaluate.py's quantization analysis on a run's step checkpoints.

    python scripts/quantization_by_step.py RUN [RUN ...] --steps 500 1000 --out docs/optimizers/quantization.csv

One row per (run, step, condition, layers): the columns of ``quantization.csv`` (docs/evaluating.md#quantization)
after ``cell`` (the run directory's name) and ``step``. Every checkpoint is scored on the same shipped held-out
sentences with the same seed, so the masked tokens are the same for every run that shares a tokenizer. A step with no
``checkpoints/step{step:07d}.ckpt`` is skipped with a line saying so (a run stopped before it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def quantization_rows(runs: list[Path], steps: list[int], keep: int | None = None) -> pd.DataFrame:
    import outlierlab as ol

    overrides = [f"quantization.keep={keep}"] if keep is not None else []
    frames = []
    for run in runs:
        for step in steps:
            ckpt = run / "checkpoints" / f"step{step:07d}.ckpt"
            if not ckpt.is_file():
                print(f"{run.name}: no checkpoint at step {step} ({ckpt.name}): skipped", file=sys.stderr)
                continue
            table = ol.evaluate(ol.load_encoder(ckpt, device="cpu"), analyses=["quantization"], transforms=["none"],
                                overrides=overrides, progress=False)["quantization"]
            frames.append(table.assign(cell=run.name, step=step))
    if not frames:
        raise SystemExit("error: none of the runs has a checkpoint at the steps asked for")
    df = pd.concat(frames, ignore_index=True)
    return df[["cell", "step", *[c for c in df.columns if c not in ("cell", "step")]]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="train.py run directories (with checkpoints/)")
    p.add_argument("--steps", nargs="+", type=int, required=True, help="the steps whose checkpoints are scored")
    p.add_argument("--keep", type=int, default=None, help="quantization.keep (default: the configuration's)")
    p.add_argument("--out", type=Path, required=True, help="the CSV to write")
    a = p.parse_args(argv)
    missing = [str(r) for r in a.runs if not (r / "checkpoints").is_dir()]
    if missing:
        p.error(f"not a train.py run directory with checkpoints/: {', '.join(missing)}")
    df = quantization_rows(a.runs, a.steps, a.keep)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out, index=False, float_format="%.6g")
    print(f"wrote {len(df)} rows to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
