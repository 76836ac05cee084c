"""Tables and curves of docs/emergence.md from training runs and their post-hoc checkpoint analysis.

Every number comes from CSVs the runs wrote: ``<run>/monitor_posthoc/metrics.csv`` (``python -m outlierlab.jobs.posthoc
<run>``: one row per checkpoint step x layer) plus the step-0 record of the live hidden-state monitor
(``<run>/monitor/hidden_states.csv``, or that of a 1-step run with the same config and seed, ``--init``, for runs
made before the monitor recorded these metrics — the initial weights are identical, checked by the step-0 argmax
row). Validation perplexity: the last ``val/ppl`` in ``<run>/csv/metrics.csv``.

    python -m lab.emergence_tables long --run learned=RUN_L --run none=RUN_N \
        --init learned=INIT_L --init none=INIT_N --out docs/emergence
    python -m lab.emergence_tables table --runs SWEEP_DIR/* --init INIT_L --out docs/emergence/sweep.csv
    python -m lab.emergence_tables grid --table docs/emergence/switches.csv --out docs/emergence/switches_grid.md

The single-seed tables of docs/emergence.md (the long runs, the driver sweep, the 400-step switch grid). Seed
studies go through ``python -m outlierlab.studies.aggregate`` and the doc blocks of ``lab.doc_tables``
(one way to make a table).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: files only
import matplotlib.pyplot as plt  # noqa: E402

from outlierlab.monitoring.history import read_history, wide_by_layer  # noqa: E402
from outlierlab.utils.atomic import save_figure, write_atomic  # noqa: E402
from outlierlab.utils.tables import md_table, read_rows, write_csv  # noqa: E402

METRICS = ["anisotropy", "kurtosis", "max_median", "max_abs", "inf_norm_ffn_output", "inf_norm_ln_input", "inf_norm_ln_output",
           "argmax_share", "argmin_share", "abs_argmax_share", "sink_share_bos", "attn_entropy", "attn_row_mass",
           "n_layernorm_outliers"]
WITH_DIMS = ["argmax_share", "argmin_share", "abs_argmax_share"]


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def run_rows(run: Path, init: Path | None = None) -> list[dict]:
    """Rows (step, layer, metrics) of one run: step 0 from the live monitor (of ``init`` if given), the rest
    from the post-hoc analysis of its checkpoints."""
    posthoc = run / "monitor_posthoc" / "metrics.csv"
    if not posthoc.is_file():
        raise SystemExit(f"error: {posthoc} is missing; run `python -m outlierlab.jobs.posthoc {run}` first")
    rows = read_rows(posthoc)
    source = (init or run) / "monitor" / "hidden_states.csv"
    live = wide_by_layer(read_history(source), [m for m in METRICS if m != "n_layernorm_outliers"],
                         with_dims=WITH_DIMS)
    step0 = [r for r in live if int(r["step"]) == 0]
    if not step0 or step0[0].get("kurtosis", "") == "":
        raise SystemExit(f"error: {source} has no step-0 kurtosis; pass --init with a 1-step run of the same config")
    for r in step0:
        # at initialisation every LayerNorm gain is 1 and every bias 0: no dim lies outside mean ± 3σ
        r["n_layernorm_outliers"] = 0 if int(r["layer"]) > 0 else ""
    return sorted(step0 + [r for r in rows if int(r["step"]) > 0], key=lambda r: (int(r["step"]), int(r["layer"])))


def val_ppl(run: Path) -> float | None:
    """The last validation perplexity the run logged (``csv/metrics.csv``), None without one."""
    logged = [v for v in (_num(r.get("val/ppl")) for r in read_rows(run / "csv" / "metrics.csv")) if v is not None]
    return logged[-1] if logged else None


def summary(rows: list[dict], step: int) -> dict:
    """Model-level figures at one step: last-layer and over-layer summaries (layer 0 = embeddings excluded)."""
    at = [r for r in rows if int(r["step"]) == step and int(r["layer"]) > 0]
    last = max(at, key=lambda r: int(r["layer"]))

    def col(name):
        return [v for v in (_num(r.get(name)) for r in at) if v is not None]

    kurt = col("kurtosis")
    return {
        "step": step,
        "kurtosis_last": _num(last["kurtosis"]),
        "kurtosis_mean": sum(kurt) / len(kurt) if kurt else None,
        "kurtosis_max": max(kurt) if kurt else None,
        "max_median_max": max(col("max_median"), default=None),
        "inf_norm_ffn_output_max": max(col("inf_norm_ffn_output"), default=None),
        "inf_norm_ln_input_max": max(col("inf_norm_ln_input"), default=None),
        "argmax_share_last": _num(last["argmax_share"]),
        "argmax_dim_last": last.get("argmax_share_dim", ""),
        "argmin_share_last": _num(last["argmin_share"]),
        # an argmax share near 1 together with anisotropy near 1 is collapse (all tokens alike), not an outlier dim
        "anisotropy_last": _num(last.get("anisotropy")),
        "argmax_share_max": max(col("argmax_share"), default=None),
        "layernorm_outliers_total": sum(col("n_layernorm_outliers")) if col("n_layernorm_outliers") else None,
        "sink_share_bos_max": max(col("sink_share_bos"), default=None),
        # 1 for softmax; 0 = a layer whose clipped-softmax attention is entirely off (no gradient reaches Q, K)
        "attn_row_mass_min": min(col("attn_row_mass"), default=None),
    }


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_csv(path, rows)
    print(f"wrote {path}")


def _fmt(v) -> str:
    if v is None or v == "":
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def long_runs(args) -> None:
    runs = dict(s.split("=", 1) for s in args.run)
    inits = dict(s.split("=", 1) for s in (args.init or []))
    all_rows = []
    for name, run in runs.items():
        for r in run_rows(Path(run), Path(inits[name]) if name in inits else None):
            all_rows.append({"pos": name, **r})
    out = Path(args.out)
    _write(out / "long_runs.csv", all_rows)
    plot_curves(all_rows, out / "long_runs.png")
    steps = sorted({int(r["step"]) for r in all_rows})
    common = [s for s in steps if all(any(int(r["step"]) == s and r["pos"] == n for r in all_rows) for n in runs)]
    picks = [s for s in common if s in (0, 500, 1000, 2000) or s % 2500 == 0] or common
    if common and common[-1] not in picks:
        picks.append(common[-1])
    table = []
    for s in picks:
        for name in runs:
            table.append({"pos": name, **summary([r for r in all_rows if r["pos"] == name], s)})
    _write(out / "long_runs_table.csv", table)
    cols = ["pos", "step", "kurtosis_last", "kurtosis_max", "max_median_max", "argmax_share_last", "argmax_dim_last",
            "argmin_share_last", "anisotropy_last", "inf_norm_ln_input_max", "layernorm_outliers_total",
            "sink_share_bos_max"]
    print(md_table(cols, ([r.get(c) for c in cols] for r in table), cell=_fmt))


def sweep_table(args) -> None:
    init = Path(args.init) if args.init else None
    table = []
    for run in sorted(Path(r) for r in args.runs):
        if not (run / "monitor_posthoc" / "metrics.csv").is_file():
            print(f"skipping {run}: no post-hoc metrics", file=sys.stderr)
            continue
        has_live_step0 = any(r["statistic"] == "kurtosis" and int(r["step"]) == 0
                             for r in read_history(run / "monitor" / "hidden_states.csv"))
        rows = run_rows(run, None if has_live_step0 else init)
        final = max(int(r["step"]) for r in rows)
        s0, sN = summary(rows, 0), summary(rows, final)
        table.append({"run": run.name, **{k: v for k, v in sN.items()},
                      "kurtosis_last_step0": s0["kurtosis_last"],
                      "kurtosis_ratio_last": sN["kurtosis_last"] / s0["kurtosis_last"],
                      "val_ppl": val_ppl(run)})
    _write(Path(args.out), table)
    cols = ["run", "step", "kurtosis_last", "kurtosis_ratio_last", "kurtosis_mean", "max_median_max",
            "inf_norm_ffn_output_max", "inf_norm_ln_input_max", "argmax_share_last", "anisotropy_last",
            "layernorm_outliers_total", "val_ppl"]
    print(md_table(cols, ([r.get(c) for c in cols] for r in table), cell=_fmt))


#: (column of a ``table`` CSV, heading, format) of the scheme x switch grids: the switch study's quantities
GRID_METRICS = [
    ("argmax_share_last", "argmax share, last layer (Luo et al. 2021; 1/d = 0.008 is no preferred dim)", "{:.2f}"),
    ("kurtosis_ratio_last", "kurtosis of the last layer, × its step-0 value (He et al. 2024)", "{:.2f}"),
    ("max_median_max", "max/median |x|, max over layers", "{:.1f}"),
    ("inf_norm_ln_input_max", "‖x‖∞ at the output-LayerNorm input, max over layers (Bondarenko et al. 2023)", "{:.1f}"),
    ("anisotropy_last", "anisotropy, last layer (Ethayarajh 2019)", "{:.2f}"),
    ("layernorm_outliers_total", "LayerNorm 3σ dims (gain AND bias), summed over layers (Kovaleva et al. 2021)", "{:.0f}"),
    ("attn_row_mass_min", "attention row mass, min over layers (1 = softmax; 0 = attention entirely clipped off)", "{:.2f}"),
    ("val_ppl", "validation perplexity", "{:.0f}"),
]
SWITCH_ORDER = ["softmax", "clipped_softmax", "clipped_softmax_alive", "gated", "op", "pre_ln", "noaffine", "rmsnorm"]
POS_ORDER = ["learned", "none", "relative", "sinusoidal", "sinusoidal-unscaled", "rope", "alibi"]


def grid(args) -> None:
    """Pivot a ``table`` CSV whose runs are named ``<pos>_<switch>`` (the first switch grid) or
    ``arch=<switch>,pos=<pos>`` (``experiment=switch_grid`` cells) into one
    markdown grid per metric: rows = position scheme, columns = switch; a missing cell is "–"."""
    with open(args.table) as f:
        rows = list(csv.DictReader(f))
    cells = {}
    for r in rows:
        if "=" in r["run"]:  # a Hydra cell name: arch=op,pos=rope (arch=default is plain softmax)
            ov = dict(kv.split("=", 1) for kv in r["run"].split(","))
            pos, switch = ov.get("pos", "learned"), ov.get("arch", "default").replace("default", "softmax")
        else:
            pos, _, switch = r["run"].partition("_")
        cells[pos, switch] = r
    poss = [p for p in POS_ORDER if any(k[0] == p for k in cells)] + sorted({k[0] for k in cells} - set(POS_ORDER))
    switches = ([w for w in SWITCH_ORDER if any(k[1] == w for k in cells)]
                + sorted({k[1] for k in cells} - set(SWITCH_ORDER)))
    steps = sorted({int(r["step"]) + 1 for r in rows})
    out = [f"<!-- written by: python -m lab.emergence_tables grid --table {args.table} --out {args.out} -->",
           f"Final checkpoint (step {', '.join(map(str, steps))}); rows: `pos=`, columns: switch.", ""]
    for col, title, fmt in GRID_METRICS:
        vals = {p_: [_num(cells[p_, w].get(col)) if (p_, w) in cells else None for w in switches] for p_ in poss}
        grid = md_table(["pos", *switches], ([p_, *("–" if v is None else fmt.format(v) for v in vals[p_])]
                                             for p_ in poss), cell=str)
        out += [f"**{title}**", "", grid, ""]
    write_atomic(Path(args.out), "\n".join(out))
    print("\n".join(out))
    print(f"wrote {args.out}")


def plot_curves(rows: list[dict], path: Path) -> None:
    panels = [("kurtosis", "activation kurtosis (He et al. 2024)"), ("max_median", "max / median |x|"),
              ("argmax_share", "signed argmax share (Luo et al. 2021)"),
              ("n_layernorm_outliers", "LayerNorm 3σ dims (gain AND bias; Kovaleva et al.)")]
    names = list(dict.fromkeys(r["pos"] for r in rows))
    layers = sorted({int(r["layer"]) for r in rows if int(r["layer"]) > 0})
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (metric, title) in zip(axes.flat, panels):
        for n_i, name in enumerate(names):
            for li, layer in enumerate(layers):
                pts = [(int(r["step"]), _num(r.get(metric))) for r in rows
                       if r["pos"] == name and int(r["layer"]) == layer and _num(r.get(metric)) is not None]
                if pts:
                    ax.plot(*zip(*pts), styles[n_i % 4], color=plt.cm.viridis(li / max(1, len(layers) - 1)),
                            label=f"pos={name} layer {layer}")
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=90)
    print(f"wrote {path}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("long", help="curves and fixed-step table of long runs, one per position scheme")
    lp.add_argument("--run", action="append", required=True, help="NAME=RUN_DIR")
    lp.add_argument("--init", action="append", help="NAME=INIT_RUN_DIR (1-step run with the same config and seed)")
    lp.add_argument("--out", required=True)
    sp = sub.add_parser("table", help="final-step table of sweep runs (one row per run directory)")
    sp.add_argument("--runs", nargs="+", required=True)
    sp.add_argument("--init", help="1-step run for runs whose live monitor lacks step-0 kurtosis")
    sp.add_argument("--out", required=True)
    gp = sub.add_parser("grid", help="scheme x switch markdown grids of a switch-sweep table CSV")
    gp.add_argument("--table", required=True, help="CSV written by `table` over <pos>_<switch> run directories")
    gp.add_argument("--out", required=True, help="markdown file")
    args = p.parse_args(argv)
    {"long": long_runs, "table": sweep_table, "grid": grid}[args.cmd](args)


if __name__ == "__main__":
    main()
