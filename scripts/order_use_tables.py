"""The tables of docs/order_use.md from the committed cells: ``python scripts/order_use_tables.py``.

Reads ``docs/order_use/sweep/<cell>/csv/metrics.csv`` (every validation's loss, accuracy and order use) and writes
``docs/order_use/sweep.csv`` -- one row per cell and validation step -- and, on stdout, the markdown tables: per cell
the first step at which order use reached 0.5 nats, and the loss / order use / accuracy at chosen steps.  The CPU
cells of ``experiment=order_recipe_cpu`` (``docs/order_use/cpu/``) go to ``docs/order_use/cpu.csv`` and one table
of every validation, learned beside none. The study's
tables come from ``python -m outlierlab.jobs.study docs/order_use/cells --contrast pos=learned,none
--out docs/order_use/study`` (3 seeds at 6,000 steps) and, with the two learned cells cut by the clock,
``... docs/order_use/sweep/study_cut_learned_seed2 docs/order_use/sweep/study_cut_learned_seed4 --until 5000
--allow-mixed-code --out docs/order_use/study_5seeds`` (5 seeds at 5,000 steps; docs/order_use.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent / "docs" / "order_use"
TARGET = 0.5  # nats of order use: the recipe target of issue 47


def cell_rows(cell: Path) -> pd.DataFrame:
    m = pd.read_csv(cell / "csv" / "metrics.csv")
    v = m.dropna(subset=["val/loss"])[["step", "val/loss", "val/order_use", "val/acc"]].copy()
    v["step"] = v["step"].astype(int) + 1  # Lightning logs validation at the step index before the increment
    v.insert(0, "cell", cell.name)
    v["finished"] = (cell / "finished.json").exists()
    overrides = (cell / ".hydra" / "overrides.yaml").read_text().splitlines()
    v["overrides"] = " ".join(o[2:] for o in overrides if not o.startswith(("- trainer=", "- threads=", "- paths.", "- callbacks.model_checkpoint")))
    return v


def main() -> int:
    cells = sorted(p for p in (ROOT / "sweep").iterdir() if (p / "csv" / "metrics.csv").exists())
    table = pd.concat([cell_rows(c) for c in cells], ignore_index=True)
    table.to_csv(ROOT / "sweep.csv", index=False, float_format="%.6g")
    print("| cell | overrides | steps run | first step with order use >= 0.5 | val loss | order use | acc |")
    print("|---|---|---|---|---|---|---|")
    for name, sub in table.groupby("cell", sort=False):
        last = sub.iloc[-1]
        reached = sub[sub["val/order_use"] >= TARGET]
        first = int(reached["step"].iloc[0]) if len(reached) else "not reached"
        print(f"| {name} | `{last['overrides']}` | {int(last['step'])}{'' if last['finished'] else ' (cut)'} | {first} "
              f"| {last['val/loss']:.3f} | {last['val/order_use']:.3f} | {last['val/acc']:.3f} |")
    study_table(ROOT / "study" / "contrasts.csv.gz")  # the aggregator's contrasts.csv, committed gzipped
    study_table(ROOT / "study_5seeds" / "contrasts.csv.gz")  # the same cells and the two cut ones, up to step 5,000
    schemes_tables(ROOT / "study_schemes" / "contrasts.csv.gz")  # every scheme vs none, 3 seeds, 6,000 steps
    study_table(ROOT / "study_large" / "contrasts.csv.gz")  # clm learned vs none on data=english_large, 3 seeds
    cpu_table(ROOT / "cpu")
    probes_table(ROOT / "probes")
    return 0


def probes_table(folder: Path) -> None:
    """Position-probe accuracy per layer (probe.py's position_probe.csv) beside order use (evaluate.py's
    order_use.csv) and the training run's last validation loss (its finished.json), one column per model folder
    (``probes/<pos>/``)."""
    models = sorted(p for p in folder.iterdir() if (p / "position_probe.csv").exists()) if folder.is_dir() else []
    if not models:
        return
    probe = {m.name: pd.read_csv(m / "position_probe.csv") for m in models}
    use = {m.name: pd.read_csv(m / "order_use.csv").set_index(["layer", "statistic"])["value"] for m in models}
    print()
    print("| | " + " | ".join(f"pos={n}" for n in probe) + " |")
    print("|---|" + "---|" * len(probe))
    print("| order use (nats, evaluate.py) | " + " | ".join(f"{use[n][('model', 'order_use')]:.4f}" for n in probe) + " |")
    loss = {m.name: json.loads((m / "train_finished.json").read_text())["metrics"]["val/loss"] for m in models}
    print("| val loss at the end of training (train.py) | " + " | ".join(f"{loss[n]:.3f}" for n in probe) + " |")
    print("| chance (majority position) | " + " | ".join(f"{probe[n]['chance'].iloc[0]:.3f}" for n in probe) + " |")
    for t in dict.fromkeys(next(iter(probe.values()))["transform"]):
        for layer in sorted(set(next(iter(probe.values()))["layer"])):
            cells = [probe[n][(probe[n]["transform"] == t) & (probe[n]["layer"] == layer)]["accuracy"].iloc[0]
                     for n in probe]
            print(f"| position probe, layer {layer}, {t} | " + " | ".join(f"{a:.3f}" for a in cells) + " |")


def cpu_table(folder: Path) -> None:
    """Every validation of the one-core cells, learned beside none, with the tokens seen (batch 128 x 64)."""
    cells = sorted(p for p in folder.iterdir() if (p / "csv" / "metrics.csv").exists()) if folder.is_dir() else []
    if not cells:
        return
    table = pd.concat([cell_rows(c) for c in cells], ignore_index=True)
    table.to_csv(folder.parent / "cpu.csv", index=False, float_format="%.6g")
    names = list(dict.fromkeys(table["cell"]))
    print()
    print("| step | tokens | " + " | ".join(f"{n}: val loss | order use" for n in names) + " |")
    print("|---|---|" + "---|---|" * len(names))
    for step, sub in table.groupby("step"):
        by = {r["cell"]: r for _, r in sub.iterrows()}
        cols = [f"{by[n]['val/loss']:.3f} | {by[n]['val/order_use']:.3f}" if n in by else "– | –" for n in names]
        print(f"| {step} | {step * 128 * 64 / 1e6:.1f}M | " + " | ".join(cols) + " |")


#: The study's rows in docs/order_use.md: (metric, layer) at the last step; the rest is in study/contrasts.csv.gz.
STUDY_ROWS = [("val/loss", "model"), ("val/ppl", "model"), ("val/order_use", "model"), ("val/acc", "model"),
              ("val/attn_local/layer_0", "model"), ("hidden/kurtosis", "max_layer"), ("hidden/argmax_share", "max_layer"),
              ("hidden/abs_argmax_share", "max_layer"), ("hidden/max_median", "max_layer"),
              ("hidden/anisotropy", "layer_4"), ("hidden/isoscore", "layer_4"), ("hidden/inf_norm_ffn_output", "max_layer"),
              ("layernorm/n_outlier_dims", "model"), ("layernorm/max_abs_gain_div", "max_layer"),
              ("hidden/sink_share_bos", "max_layer")]


def study_table(contrasts_csv: Path) -> None:
    c = pd.read_csv(contrasts_csv)
    print()
    print("| metric | layer | step | learned | none | diff [95% CI] | n pairs | p_holm / q_bh | seeds with the sign |")
    print("|---|---|---|---|---|---|---|---|---|")
    for metric, layer in STUDY_ROWS:
        sub = c[(c["metric"] == metric) & (c["layer"] == layer)]
        if sub.empty:
            continue
        r = sub.loc[sub["step"].idxmax()]
        corrected = f"{r['p_holm']:.3g} (Holm)" if pd.notna(r["p_holm"]) else (
            f"{r['q_bh']:.3g} (BH)" if pd.notna(r["q_bh"]) else "not tested")
        tost = f"; TOST ±{r['margin']:g}: p {r['tost_p']:.3g}" if pd.notna(r.get("tost_p")) else ""
        print(f"| {metric} | {layer} | {int(r['step'])} | {r['mean_a']:.4g} | {r['mean_b']:.4g} | {r['diff']:.3g} "
              f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}]{tost} | {int(r['n_pairs']) if pd.notna(r['n_pairs']) else '–'} | "
              f"{corrected} | {str(r['ordering']).split(';')[0]} |")


#: The outlier measures of the schemes table (at the last step), each beside its BH q against pos=none.
SCHEME_OUTLIER_ROWS = [("hidden/kurtosis", "max_layer"), ("hidden/abs_argmax_share", "max_layer"),
                       ("hidden/max_median", "max_layer"), ("hidden/inf_norm_ffn_output", "max_layer"),
                       ("hidden/anisotropy", "layer_4"), ("hidden/isoscore", "layer_4"),
                       ("layernorm/n_outlier_dims", "model")]


def schemes_tables(contrasts_csv: Path) -> None:
    """Every scheme against pos=none (the aggregator's contrasts ``pos: <scheme> - none``): the primary metrics with
    their Holm p and the order use at each validation, then the outlier measures with their BH q."""
    if not contrasts_csv.exists():
        return
    c = pd.read_csv(contrasts_csv)
    schemes = [name.split(":")[1].split("-")[0].strip() for name in dict.fromkeys(c["contrast"])]
    val_steps = sorted(c.loc[c["metric"] == "val/order_use", "step"].unique())

    def at(scheme: str, metric: str, layer: str, step: int | None = None) -> pd.Series:
        sub = c[(c["contrast"] == f"pos: {scheme} - none") & (c["metric"] == metric) & (c["layer"] == layer)]
        return sub.loc[sub["step"].idxmax()] if step is None else sub[sub["step"] == step].iloc[0]

    print()
    print("| pos | val loss | - none [95% CI], Holm p | order use | - none [95% CI], Holm p | acc | order use at "
          + ", ".join(f"{s + 1:,}" for s in val_steps[:-1]) + " |")
    print("|---|---|---|---|---|---|---|")
    for scheme in schemes:
        loss, use, acc = at(scheme, "val/loss", "model"), at(scheme, "val/order_use", "model"), at(scheme, "val/acc", "model")
        early = " / ".join(f"{at(scheme, 'val/order_use', 'model', s)['mean_a']:.2f}" for s in val_steps[:-1])
        print(f"| {scheme} | {loss['mean_a']:.3f} | {loss['diff']:.2f} [{loss['ci_low']:.2f}, {loss['ci_high']:.2f}], "
              f"{loss['p_holm']:.2g} | {use['mean_a']:.2f} | {use['diff']:.2f} [{use['ci_low']:.2f}, "
              f"{use['ci_high']:.2f}], {use['p_holm']:.2g} | {acc['mean_a']:.3f} | {early} |")
    r = at(schemes[0], "val/loss", "model")
    print(f"| none | {r['mean_b']:.3f} | | {at(schemes[0], 'val/order_use', 'model')['mean_b']:.4f} | | "
          f"{at(schemes[0], 'val/acc', 'model')['mean_b']:.3f} | |")
    print()
    print("| pos | " + " | ".join(f"{m.split('/')[1]} ({layer})" for m, layer in SCHEME_OUTLIER_ROWS) + " |")
    print("|---|" + "---|" * len(SCHEME_OUTLIER_ROWS))
    for scheme in schemes:
        cells = []
        for metric, layer in SCHEME_OUTLIER_ROWS:
            r = at(scheme, metric, layer)
            q = f"q {r['q_bh']:.2g}" if pd.notna(r["q_bh"]) else "not tested"
            cells.append(f"**{r['mean_a']:.3g}** ({q})" if pd.notna(r["q_bh"]) and r["q_bh"] < 0.05
                         else f"{r['mean_a']:.3g} ({q})")
        print(f"| {scheme} | " + " | ".join(cells) + " |")
    print("| none | " + " | ".join(f"{at(schemes[0], m, layer)['mean_b']:.3g}" for m, layer in SCHEME_OUTLIER_ROWS)
          + " |")


if __name__ == "__main__":
    sys.exit(main())
