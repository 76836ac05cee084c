"""Turn the CSVs written by train.py / probe.py / evaluate.py into the tables and plots of
docs/reproduction.md. Reads only files in the run directories; computes nothing new.

    python scripts/summarize_reproduction.py [outputs/reproduction] [docs/reproduction]
"""

from __future__ import annotations

import csv
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SCHEMES = ["learned", "none", "relative", "rope"]


def rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fmt(x, nd=2):
    try:
        return f"{float(x):.{nd}f}"
    except (TypeError, ValueError):
        return str(x) if x not in (None, "") else "–"


def table(header: list[str], body: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in body]
    return "\n".join(out)


def line_plot(series: dict, xlabel: str, ylabel: str, filename: str, title: str = "", marker=None) -> Path | None:
    """One line per scheme; saved into the output folder (argv[2])."""
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for pos, (x, y) in series.items():
        ax.plot(x, y, marker=marker, label=pos)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/reproduction") / filename
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def training(root: Path) -> str:
    body = []
    for pos in SCHEMES:
        m = rows(root / f"train_{pos}" / "csv" / "metrics.csv")
        val = [(int(r["step"]), float(r["val/loss"]), float(r["val/ppl"])) for r in m if r.get("val/loss")]
        tps = [float(r["train/device/items_per_sec"]) for r in m if r.get("train/device/items_per_sec")]
        if val:
            body.append([pos, val[-1][0] + 1, fmt(val[0][1]), fmt(val[-1][1]), fmt(val[-1][2], 1),
                         fmt(sum(tps[-5:]) / max(1, len(tps[-5:])), 0)])
    return table(["pos", "steps", "first val loss", "final val loss", "final val ppl", "tokens/s (last 5 logs; 4 runs shared 2 cores)"], body)


def layernorm(root: Path) -> str:
    steps_wanted, body = None, []
    for pos in SCHEMES:
        ln = rows(root / f"train_{pos}" / "monitor" / "layernorm.csv")
        if not ln:
            continue
        per_step = defaultdict(lambda: [0, 0, 0])
        for r in ln:
            s = int(r["step"])
            if r["statistic"] == "n_gain_outliers":
                per_step[s][0] += int(float(r["value"]))
            elif r["statistic"] == "n_bias_outliers":
                per_step[s][1] += int(float(r["value"]))
            elif r["statistic"] in ("n_shared_gain_outliers", "n_shared_bias_outliers", "n_outlier_dims"):
                per_step[s][2] += int(float(r["value"]))
        steps = sorted(per_step)
        steps_wanted = [s for s in steps if s % 200 == 0] + ([steps[-1]] if steps[-1] % 200 else [])
        shared = sorted({r["dim"] for r in ln if int(r["step"]) == steps[-1] and (r["statistic"].startswith("shared_") or r["statistic"] == "outlier_dim") and r["dim"]},
                        key=int)
        body.append([pos] + [f"{per_step[s][0]}/{per_step[s][1]}/{per_step[s][2]}" for s in steps_wanted]
                    + [", ".join(shared) or "–"])
    header = ["pos"] + [f"step {s}" for s in (steps_wanted or [])] + ["shared dims at the end"]
    return table(header, body)


def hidden(root: Path) -> tuple[str, Path | None]:
    body, series = [], {}
    for pos in SCHEMES:
        hs = rows(root / f"train_{pos}" / "monitor" / "hidden_states.csv")
        if not hs:
            continue
        last = max(int(r["step"]) for r in hs)
        cells = {}
        for r in hs:
            if int(r["step"]) == last and r["statistic"] in ("argmax_share", "anisotropy"):
                cells.setdefault(r["name"], {})[r["statistic"]] = (r["dim"], float(r["value"]))
        layers = sorted(cells, key=lambda n: int(n.split("_")[1]))
        body.append([pos] + [f"{cells[n]['argmax_share'][1]:.2f} (dim {cells[n]['argmax_share'][0]}) / {cells[n]['anisotropy'][1]:.2f}"
                             for n in layers])
        top = layers[-1]
        series[pos] = sorted((int(r["step"]), float(r["value"])) for r in hs
                             if r["name"] == top and r["statistic"] == "argmax_share")
    header = ["pos"] + [f"layer {i}" for i in range(len(body[0]) - 1)] if body else ["pos"]
    fig_path = line_plot({k: ([p[0] for p in v], [p[1] for p in v]) for k, v in series.items()},
                         "training step", "argmax share, last layer", "argmax_share_over_training.png",
                         "Share of tokens whose max falls on the most common dim")
    return table(header, body), fig_path


def probe(root: Path) -> tuple[str, Path | None]:
    body, curves = [], {}
    for pos in SCHEMES:
        p = [r for r in rows(root / f"probe_{pos}" / "position_probe.csv") if r.get("transform") == "none"]
        if p:
            p.sort(key=lambda r: int(r["layer"]))
            curves[pos] = [float(r["accuracy"]) for r in p]
            body.append([pos, fmt(p[0].get("chance"), 3)] + [fmt(r["accuracy"]) for r in p])
    n = max((len(c) for c in curves.values()), default=0)
    fig_path = line_plot({k: (list(range(len(c))), c) for k, c in curves.items()},
                         "layer (0 = embeddings)", "position-probe accuracy", "position_probe.png", marker="o")
    return table(["pos", "chance"] + [f"layer {i}" for i in range(n)], body), fig_path


def probe_by_position(root: Path) -> str:
    """Accuracy at position 0 (<s>), 1, 2 and the mean over the middle positions 5-40."""
    body = []
    for pos in SCHEMES:
        rs = [r for r in rows(root / f"probe_{pos}" / "position_probe_by_position.csv") if r["transform"] == "none"]
        for layer in sorted({int(r["layer"]) for r in rs}):
            acc = {int(r["position"]): (float(r["accuracy"]), int(r["n_test"])) for r in rs if int(r["layer"]) == layer}
            mid = [a for p, (a, n) in acc.items() if 5 <= p <= 40 and n >= 20]
            body.append([pos, layer] + [fmt(acc.get(p, ("–", 0))[0]) for p in (0, 1, 2)]
                        + [fmt(sum(mid) / max(1, len(mid)), 3), fmt(1 / max(1, len(mid)), 3)])
    return table(["pos", "layer", "acc @0 (<s>)", "acc @1", "acc @2", "mean acc @5-40", "chance @5-40"], body)


def anisotropy(root: Path) -> str:
    body = []
    for pos in SCHEMES:
        a = rows(root / f"evaluate_{pos}" / "anisotropy.csv")
        by = defaultdict(dict)
        for r in a:
            by[r["transform"]][int(r["layer"])] = float(r["anisotropy"])
        for t in ("none", "clip", "whiten"):
            if by.get(t):
                body.append([pos, t] + [fmt(by[t][l]) for l in sorted(by[t])])
    n = max((len(r) - 2 for r in body), default=0)
    return table(["pos", "transform"] + [f"layer {i}" for i in range(n)], body)


def wic(root: Path) -> str:
    body = []
    for pos in SCHEMES:
        w = rows(root / f"evaluate_{pos}" / "wic.csv")
        for t in ("none", "clip", "whiten"):
            rs = [r for r in w if r["transform"] == t]
            if rs:
                best = max(rs, key=lambda r: float(r["best_accuracy"]))
                body.append([pos, t, fmt(best["best_accuracy"], 3), best["layer"], best["best_threshold"]])
    return table(["pos", "transform", "best accuracy", "layer", "threshold"], body) + "\n\nAll-true / surface-form baseline: 0.500."


def ablation(root: Path) -> str:
    body = []
    for pos in SCHEMES:
        for r in rows(root / f"evaluate_{pos}" / "ablation.csv"):
            if r["condition"] != "random_draw":
                dims = r.get("dims", "")
                dims = f"{dims.count('|') + 1} seeded draws" if "|" in dims else dims
                body.append([pos, r["condition"], r.get("n_dims"), dims, fmt(r.get("loss")),
                             fmt(r.get("ppl"), 1), fmt(r.get("top1"), 3), fmt(r.get("loss_std"), 3)])
    return table(["pos", "condition", "n dims", "dims", "MLM loss", "ppl", "top-1", "loss std"], body)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/reproduction")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/reproduction")
    out.mkdir(parents=True, exist_ok=True)
    for pos in SCHEMES:
        for png in ("layernorm_heatmap_gain.png", "hidden_mean_vectors.png"):
            src = root / f"train_{pos}" / "monitor" / png
            if src.exists():
                shutil.copy(src, out / f"{pos}_{png}")
    hid, fig1 = hidden(root)
    prb, fig2 = probe(root)
    print("### Training\n\n" + training(root))
    print("\n### LayerNorm 3σ dims over training (gain / bias / model-level shared, summed over LayerNorms)\n\n" + layernorm(root))
    print("\n### Hidden-state outliers at the last step: argmax share (dim) / anisotropy\n\n" + hid)
    print("\n### Position probe accuracy (transform none)\n\n" + prb)
    print("\n### Position probe accuracy by position (transform none)\n\n" + probe_by_position(root))
    print("\n### Anisotropy before/after clip and whiten\n\n" + anisotropy(root))
    print("\n### WordNet WiC-style accuracy (best layer and threshold)\n\n" + wic(root))
    print("\n### Outlier ablation (masked-LM on held-out Persuasion sentences)\n\n" + ablation(root))
    print("\nFigures:", fig1, fig2)


if __name__ == "__main__":
    main()
