"""Where the largest activations of a train.py checkpoint sit: per layer, the input of the output LayerNorm
(residual + FFN output, Bondarenko et al. 2023's site) — its largest |x|, the token, position and dim, and the
norm of that token's whole vector — on the shipped held-out sentences (the monitors' 32).  Massive activations
on delimiter tokens (Sun et al. 2024) show here while the kurtosis over ordinary tokens stays low.

    python scripts/massive_activations.py --run learned=RUN_L --run none=RUN_N --tokenizer DIR \
        --out docs/emergence/massive_activations.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from outlierlab.datamodules.eval_data import load_sentences  # noqa: E402
from outlierlab.models.checkpoint import model_from_checkpoint, read_checkpoint  # noqa: E402


def largest_at_output_norm_inputs(model, enc, tok) -> list[dict]:
    """One row per layer: the largest |x| over non-pad tokens at the input of the layer's output LayerNorm."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [mod.register_forward_hook(lambda m, inp, out, name=name: seen.__setitem__(name, inp[0].detach()))
             for name, mod in model.named_modules() if name.endswith("output.LayerNorm") and "attention" not in name]
    with torch.no_grad():
        model(enc["input_ids"], attention_mask=enc["attention_mask"])
    for h in hooks:
        h.remove()
    rows = []
    for layer, (name, x) in enumerate(seen.items(), start=1):
        a = x.abs() * enc["attention_mask"][..., None]
        b, t, i = torch.unravel_index(a.argmax(), a.shape)
        row = x[b, t]
        rows.append({"layer": layer, "max_abs": float(a.max()), "token": tok.convert_ids_to_tokens(int(enc["input_ids"][b, t])),
                     "position": int(t), "dim": int(i), "token_vector_norm": float(row.norm()),
                     "median_token_vector_norm": float(x[enc["attention_mask"].bool()].norm(dim=-1).median())})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, help="NAME=RUN_DIR (uses checkpoints/last.ckpt)")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--n-sequences", type=int, default=32)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    texts = load_sentences()[: args.n_sequences]
    enc = tok(texts, padding=True, truncation=True, max_length=args.max_length, return_tensors="pt")
    out = []
    for spec in args.run:
        name, run = spec.split("=", 1)
        ckpt = Path(run) / "checkpoints" / "last.ckpt"
        step = int(read_checkpoint(ckpt, mmap=True).get("global_step", -1))
        out += [{"run": name, "step": step, **r} for r in largest_at_output_norm_inputs(model_from_checkpoint(read_checkpoint(ckpt), ckpt).eval(), enc, tok)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, list(out[0]))
        w.writeheader()
        w.writerows(out)
    for r in out:
        print(r)


if __name__ == "__main__":
    main()
