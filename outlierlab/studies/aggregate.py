"""Aggregate a sweep over seeds: ``python -m outlierlab.studies.aggregate multirun/<study> [--contrast key=a,b]``.

Reads every cell of one or more sweep directories (``outlierlab.studies.cells``), groups the cells by every override
except the seed, and writes into ``<sweep>/study/`` (or ``--out``):

* ``study.csv`` -- group x step x layer x metric: n seeds, mean, std, the 95 % confidence interval of the mean
  (Student t with n - 1 df, ``outlierlab.studies.seed_statistics``), min, max and the seeds;
* ``study.md`` -- the groups, the unfinished cells, the headline metrics at chosen steps (default: step 0, the middle
  and the last recorded step), and for each ``--contrast key=a,b`` the difference of means with its CI, a paired
  t-test when both groups hold the same seeds (else Welch's), and whether the ordering holds in every seed;
* ``contrasts.csv`` -- those contrasts at every step;
* ``curves/<metric>__<layer>.png`` -- mean and CI band per group over steps, the seeds drawn faintly behind.

Refused in one line, before anything is written: a group whose cells ran different step budgets, differ in a
resolved setting that is not an override, repeat a seed, or ran on different code versions (unless
``--allow-mixed-code``; cells without a manifest count as one unknown version).  Unfinished cells are listed and
left out, unless ``--until STEP`` admits training cells stopped before their budget whose numbers reach STEP (every
cell's rows after STEP are then dropped).  Unusable cells (``outlierlab.studies.cells``) are listed one line each,
never averaged.  Every row states its n; ``n_below_seeds`` marks a row with fewer seeds than its group holds.
Bounded measures (shares, cosines) get intervals inside their range; contrasts get corrected p-values within declared
families (outlier measures at the last step every cell reached, performance measures, the exploratory rest; loss
never pooled with an outlier measure), the minimum detectable effect and TOST (``outlierlab.studies.design``).
Paired tests pair on each cell's resolved seed.  A group that mixes code versions is checked against the replicates
of its own configuration (``--replicates``: ``outlierlab.studies.replicates``).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Collection, Mapping, Sequence

import pandas as pd

from outlierlab.metrics.word_order import ORDER_USE_THRESHOLD, cannot_use_order
from outlierlab.studies.seed_statistics import CI_METHOD, CONSTANT, contrast, summarize
from outlierlab.studies.study_inference import bounded_interval, bounds_of, clip_to_range, difference_range
from outlierlab.jobs.run_state import failed_line, failed_run
from outlierlab.studies.cells import LAYER_MAX, SEED_DEPENDENT, Cell, cell_numbers, find_cells, portable_config
from outlierlab.studies.design import assign_families, declared_design
from outlierlab.studies.replicates import markdown as replicates_markdown, mixed_code_coverage
from outlierlab.utils.atomic import write_atomic

#: Metrics shown in study.md and drawn by default (the emergence quantities of docs/emergence.md).
HEADLINE = ["hidden/kurtosis", "hidden/argmax_share", "hidden/abs_argmax_share", "hidden/max_median",
            "hidden/anisotropy", "posthoc/n_layernorm_outliers", "val/ppl", "val/order_use"]
#: How study.csv and contrasts.csv write floats (6 significant digits).
CSV_FLOATS = "%.6g"


def order_use_flags(per_seed: pd.DataFrame, threshold: float = ORDER_USE_THRESHOLD,
                    orderless: Collection[str] = ()) -> list[str]:
    """One line per cell whose order use at its last recorded step is below ``threshold`` nats: a model that does not
    use token order yet (``outlierlab.metrics.word_order``), so a position-scheme contrast it enters compares
    bag-of-words models -- or, for the groups in ``orderless`` (masked LMs without positions, ``orderless_groups``),
    one that cannot, said on its line.  Cells that never measured it (older code, ``module.order_use=false``) are
    named as such once, in one line, when any cell of the study did measure it."""
    rows = per_seed[per_seed["metric"] == "val/order_use"]
    lines = []
    for (group, seed), sub in rows.groupby(["group", "seed"], sort=True, dropna=False):
        last = sub.loc[sub["step"].idxmax()]
        if float(last["value"]) < threshold:
            why = " (cannot: a masked LM without positions, 0 by construction)" if group in orderless else ""
            lines.append(f"{group}, seed {seed}: order use {float(last['value']):.3f} nats at step {int(last['step'])}"
                         f"{why}")
    if not rows.empty:
        measured = set(map(tuple, rows[["group", "seed"]].drop_duplicates().values.tolist()))
        missing = sorted({(g, s) for g, s in per_seed[["group", "seed"]].drop_duplicates().values.tolist()} - measured,
                         key=str)
        if missing:
            lines.append("order use not measured: " + ", ".join(f"{g}, seed {s}" for g, s in missing))
    return lines


def orderless_groups(groups: Mapping[str, Sequence[Cell]]) -> set[str]:
    """The groups whose every cell is a masked LM without positions: permutation-equivariant, order use 0 by
    construction (a causal model without positions sees order through its mask)."""
    return {label for label, cells in groups.items() if cells and all(
        cannot_use_order(c.config.get("model.pos.name"), bool(c.config.get("model.causal", False))) for c in cells)}


def group_label(overrides: dict[str, str], varying: Sequence[str]) -> str:
    """``pos=learned,arch=op``: the overrides that differ between groups (all of them if none differ)."""
    keys = [k for k in sorted(overrides) if k in varying] or sorted(overrides)
    return ",".join(f"{k}={overrides[k]}" for k in keys) or "all"


def check_groups(groups: dict[str, list[Cell]], allow_mixed_code: bool = False) -> None:
    """Refuse a group the aggregator cannot average honestly (one line each, raised together)."""
    errors = []
    for label, cells in groups.items():
        codes = defaultdict(list)
        for c in cells:
            codes[c.code].append(c.seed)
        if len(codes) > 1 and not allow_mixed_code:
            parts = "; ".join(f"{v} (seeds {', '.join(map(str, s))})" for v, s in sorted(codes.items()))
            errors.append(f"group {label} mixes code versions: {parts}; re-run the older cells on the current code "
                          "or pass --allow-mixed-code")
            continue
        budgets = defaultdict(list)
        for c in cells:
            budgets[c.max_steps].append(c.seed)
        if len(budgets) > 1:
            parts = "; ".join(f"{b} steps (seeds {', '.join(map(str, s))})" for b, s in budgets.items())
            errors.append(f"group {label} mixes step budgets: {parts}; run them as separate sweeps or override "
                          "trainer.max_steps explicitly so they form separate groups")
            continue
        seeds = [c.seed if c.series_step is None else (c.seed, c.series_step) for c in cells]  # series: seed x step
        dupes = sorted({s for s in seeds if seeds.count(s) > 1}, key=str)
        if dupes:
            errors.append(f"group {label} holds seed {dupes[0]} more than once ({', '.join(str(c.path) for c, s in zip(cells, seeds) if s == dupes[0])})")
            continue
        ref = portable_config(cells[0])
        for c in cells[1:]:
            other = portable_config(c)
            keys = sorted(k for k in set(ref) | set(other) if not SEED_DEPENDENT.search(k)
                          and ref.get(k) != other.get(k))
            if keys:
                shown = ", ".join(f"{k}: {ref.get(k)!r} vs {c.config.get(k)!r}" for k in keys[:3])
                errors.append(f"group {label}: {cells[0].path.name} and {c.path.name} differ in settings that are not "
                              f"overrides ({shown}{' ...' if len(keys) > 3 else ''}); they cannot be averaged as seeds")
                break
    if errors:
        raise ValueError(" | ".join(errors))


def aggregate(cells: list[Cell], allow_mixed_code: bool = False, until: int | None = None
              ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, list[Cell]]]:
    """``(summary, per_seed, groups)``: the study table, every usable cell's numbers with its group and
    seed, and the usable cells by group label; with ``until``, only the rows up to that step."""
    usable = [c for c in cells if c.usable]
    if not usable:
        bad = [c for c in cells if c.problems]
        raise ValueError(f"none of the {len(cells)} cells is finished and intact; nothing to aggregate ("
                         + "; ".join([p for c in bad for p in c.problems][:5]
                                     or ["unfinished: " + ", ".join(c.path.name for c in cells)]) + ")")
    keys = sorted({k for c in usable for k in c.overrides})
    varying = [k for k in keys if len({c.overrides.get(k) for c in usable}) > 1]
    groups: dict[str, list[Cell]] = defaultdict(list)
    for c in usable:
        groups[group_label(c.overrides, varying)].append(c)
    check_groups(groups, allow_mixed_code)
    frames = []
    for label, members in groups.items():
        for c in members:
            df = cell_numbers(c)
            if until is not None:
                df = df[df["step"] <= until].copy()
            df["group"], df["seed"] = label, c.seed
            frames.append(df)
    per_seed = pd.concat(frames, ignore_index=True)
    rows = []
    n_seeds = {label: len({c.seed for c in cells}) for label, cells in groups.items()}
    for (label, step, layer, metric), sub in per_seed.groupby(["group", "step", "layer", "metric"], sort=True):
        values = sub["value"].tolist()
        s = summarize(values)
        low, high, method = s.ci_low, s.ci_high, CI_METHOD
        rng = bounds_of(metric)
        if rng is not None and s.n >= 2:
            low, high, method = bounded_interval(values, *rng)
        if s.note == CONSTANT:
            low, high, method = math.nan, math.nan, CONSTANT
        rows.append({"group": label, "step": int(step), "layer": layer, "metric": metric, "ci": method, "n": s.n,
                     "n_below_seeds": s.n < n_seeds[label], "mean": s.mean, "std": s.std, "ci_low": low,
                     "ci_high": high, "min": s.min, "max": s.max,
                     "seeds": " ".join(str(x) for x in sorted(sub["seed"].dropna().astype(int).unique()))})
    return pd.DataFrame(rows), per_seed, dict(groups)


def parse_contrast(spec: str) -> tuple[str, str, str]:
    """``pos=learned,none`` -> ``("pos", "learned", "none")``."""
    key, _, values = spec.partition("=")
    parts = [v for v in values.split(",") if v]
    if not key or len(parts) != 2:
        raise ValueError(f"--contrast {spec!r}: write key=a,b (e.g. pos=learned,none)")
    return key, parts[0], parts[1]


def _also_differ(by_rest: Mapping[tuple, Mapping[str, str]], key: str, a: str, b: str) -> str:
    """``; pos=a and pos=b groups also differ in x (1 vs 2)``: the other overrides that keep the closest a- and b-
    groups apart, for the refusal above (empty when one of the values has no group)."""
    with_a = [dict(rest) for rest, v in by_rest.items() if a in v]
    with_b = [dict(rest) for rest, v in by_rest.items() if b in v]
    if not with_a or not with_b:
        return ""

    def apart(x: dict, y: dict) -> list[str]:
        return sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))

    x, y = min(((x, y) for x in with_a for y in with_b), key=lambda p: len(apart(*p)))
    shown = ", ".join(f"{k} ({x.get(k, 'unset')} vs {y.get(k, 'unset')})" for k in apart(x, y)[:3])
    return f"; the {key}={a} and {key}={b} groups also differ in {shown}"


def contrast_table(per_seed: pd.DataFrame, groups: dict[str, list[Cell]], spec: str) -> pd.DataFrame:
    """Every pair of groups that differ only in ``key`` (a vs b): the contrast at every step/layer/metric."""
    key, a, b = parse_contrast(spec)
    by_rest: dict[tuple, dict[str, str]] = defaultdict(dict)
    for label, cells in groups.items():
        ov = cells[0].overrides
        if ov.get(key) in (a, b):
            rest = tuple(sorted((k, v) for k, v in ov.items() if k != key))
            by_rest[rest][ov[key]] = label
    pairs = [(v[a], v[b]) for v in by_rest.values() if a in v and b in v]
    if not pairs:
        present = sorted({c.overrides.get(key) for cells in groups.values() for c in cells} - {None})
        raise ValueError(f"--contrast {spec}: no two groups differ only in {key} = {a} vs {b} "
                         f"(values of {key} in this study: {', '.join(present) or 'none'}"
                         f"{_also_differ(by_rest, key, a, b)})")
    rows = []
    seeds = {label: len({c.seed for c in cells}) for label, cells in groups.items()}
    for ga, gb in pairs:
        da, db = per_seed[per_seed["group"] == ga], per_seed[per_seed["group"] == gb]
        merged = da.merge(db, on=["step", "layer", "metric"], suffixes=("_a", "_b"))
        for (step, layer, metric), sub in merged.groupby(["step", "layer", "metric"]):
            va = dict(zip(sub["seed_a"], sub["value_a"]))
            vb = dict(zip(sub["seed_b"], sub["value_b"]))
            try:
                c = contrast(va, vb)
            except ValueError:
                continue
            low, high, note = c.ci_low, c.ci_high, c.note
            rng = bounds_of(metric)
            if rng is not None:  # a difference of two shares is in [-1, 1]; the t interval knows no range
                low, high, clipped = clip_to_range(low, high, difference_range(*rng))
                note = "; ".join(x for x in (note, clipped) if x)
            rows.append({"contrast": f"{key}: {a} - {b}", "group_a": ga, "group_b": gb, "step": int(step),
                         "layer": layer, "metric": metric, "mean_a": sum(va.values()) / len(va),
                         "mean_b": sum(vb.values()) / len(vb), "diff": c.diff, "ci_low": low,
                         "ci_high": high, "test": c.test, "p_value": c.p_value, "n_a": c.n_a, "n_b": c.n_b,
                         "n_pairs": c.n_pairs, "n_below_seeds": c.n_a < seeds[ga] or c.n_b < seeds[gb],
                         "sd": c.sd, "same_order_every_seed": c.same_order, "ordering": c.order_count,
                         "note": note})
    return pd.DataFrame(rows)


def default_steps(summary: pd.DataFrame) -> list[int]:
    """Step 0, the recorded step nearest the middle, and the last recorded step."""
    steps = sorted(s for s in summary["step"].unique() if s >= 0)
    if not steps:
        return [-1]
    last = steps[-1]
    middle = min(steps, key=lambda s: abs(s - last / 2))
    return sorted({steps[0], middle, last})


def default_layers(summary: pd.DataFrame) -> list[str]:
    """The last encoder layer and the across-layer maximum (the layers the emergence study reports)."""
    layers = [x for x in summary["layer"].unique() if x.startswith("layer_") and x[6:].isdigit()]
    last = max(layers, key=lambda x: int(x[6:])) if layers else None
    return [x for x in (last, LAYER_MAX, "model") if x is not None]


def run(paths: Sequence[str], out: str | None = None, contrasts: Sequence[str] = (), metrics: Sequence[str] | None = None,
        steps: Sequence[int] | None = None, layers: Sequence[str] | None = None, plots: bool = True,
        primary: Sequence[str] | None = None, equivalence_margin=None, allow_mixed_code: bool = False,
        until: int | None = None, replicates: Sequence[str] = ()) -> dict:
    """The study of the cells under ``paths`` (see the module docstring); ``replicates``: more cells, read only to
    look for replicates of the study's mixed-code groups (``outlierlab.studies.replicates``)."""
    from outlierlab.studies.report import write_curves, write_markdown

    for spec in contrasts:
        parse_contrast(spec)  # a malformed contrast fails before any reading
    if until is not None and until < 0:
        raise ValueError(f"--until {until}: give a training step >= 0 (the cells are compared up to it)")
    cells = find_cells(list(paths), until)
    design = declared_design(cells, primary, equivalence_margin)
    contrasts = list(contrasts) or design["contrasts"]  # the design's own contrasts when none are given
    summary, per_seed, groups = aggregate(cells, allow_mixed_code, until)
    if summary.empty:  # e.g. --until before every cell's first record
        raise ValueError(f"no numbers to aggregate in {len(cells)} cell(s)"
                         + (f" at or before step --until {until}" if until is not None else "")
                         + f" under {', '.join(map(str, paths))}")
    # a name the cells do not have is refused (a typo would give other metrics' tables)
    for option, asked, have in (("--metrics", metrics, summary["metric"]), ("--layers", layers, summary["layer"])):
        missing = [x for x in asked or () if x not in set(have)]
        if missing:
            known = sorted(set(have))
            raise ValueError(f"{option} {','.join(missing)}: not in these cells; they have {len(known)}: "
                             f"{', '.join(known[:12])}{', ...' if len(known) > 12 else ''}")
    coverage = mixed_code_coverage(groups, find_cells(list(replicates)) if replicates else ())
    tables = {spec: contrast_table(per_seed, groups, spec) for spec in contrasts}
    if tables:
        joined = assign_families(pd.concat(tables.values(), ignore_index=True), per_seed, design)
        tables = {spec: joined[joined["contrast"] == t["contrast"].iloc[0]] if len(t) else t for spec, t in tables.items()}
    out_dir = Path(out) if out else Path(str(paths[0]).removesuffix(".parquet")) / "study"
    out_dir.mkdir(parents=True, exist_ok=True)
    # 6 significant digits: a mean over a handful of seeds is uncertain from its 2nd-3rd digit on (its CI says so),
    # and the 4 digits more that %.10g wrote were a third of the committed studies' bytes.
    # each file atomically: a reader (the doc tables, a second look) never meets one cut by a kill or a full disk
    write_atomic(out_dir / "study.csv", summary.to_csv(index=False, float_format=CSV_FLOATS))
    if tables:
        write_atomic(out_dir / "contrasts.csv",
                     pd.concat(tables.values(), ignore_index=True).to_csv(index=False, float_format=CSV_FLOATS))
    else:  # an earlier aggregation's contrasts would sit beside a study.md that has none
        (out_dir / "contrasts.csv").unlink(missing_ok=True)
    metrics = [m for m in (metrics or HEADLINE) if m in set(summary["metric"])]
    if not metrics:  # e.g. an evaluate.py study: none of the training headlines; show its first metrics
        metrics = sorted(summary["metric"].unique())[:12]
    steps = list(steps) if steps else default_steps(summary)
    layers = list(layers) if layers else default_layers(summary)
    unfinished = [c for c in cells if not c.usable and not c.problems]
    # a cell whose last attempt failed says how (failed.json, run_state.failed_run): listed with its error
    failed = {c.path.name: failed_run(c.path) for c in unfinished}
    failed = {name: f for name, f in failed.items() if f is not None}
    unusable = [c for c in cells if c.problems]
    notes = [n for c in cells if c.usable for n in c.notes]
    no_order = order_use_flags(per_seed, orderless=orderless_groups(groups))
    write_markdown(out_dir / "study.md", paths, summary, tables, groups, unfinished, metrics, steps, layers,
                   unusable=unusable, failed=failed, notes=notes, design=design, no_order_use=no_order,
                   replicates=replicates_markdown(coverage))
    pngs = write_curves(out_dir / "curves", summary, per_seed, metrics, layers) if plots else []
    remove_stale_curves(out_dir / "curves", pngs)
    return {"out": out_dir, "groups": {k: len(v) for k, v in groups.items()},
            "unfinished": [str(c.path) for c in unfinished if c.path.name not in failed],
            "failed": {name: failed_line(f) for name, f in failed.items()},
            "unusable": [p for c in unusable for p in c.problems], "notes": notes, "plots": pngs, "design": design,
            "no_order_use": no_order, "replicates": coverage, "contrasts": tables}


def remove_stale_curves(folder: Path, written: Sequence[Path]) -> list[Path]:
    """Remove the PNGs in ``folder`` (the aggregator's own ``curves/``) that this aggregation did not draw: those of
    an earlier one into the same output folder showed other metrics, or other cells' numbers, as this study's."""
    keep = {Path(p).name for p in written}
    stale = [p for p in sorted(folder.glob("*.png")) if p.name not in keep] if folder.is_dir() else []
    for p in stale:
        p.unlink()
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    return stale


def _names(text: str) -> list[str]:
    """A comma-separated option's items, empty ones dropped: ``a,b,`` -> ``["a", "b"]``."""
    return [x for x in text.split(",") if x]


def _steps(text: str) -> list[int]:
    return [int(x) for x in _names(text)]


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m outlierlab.studies.aggregate``."""
    parser = argparse.ArgumentParser(prog="python -m outlierlab.studies.aggregate", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="multirun sweep directories (or run directories)")
    parser.add_argument("--out", default=None, help="output folder (default <first path>/study)")
    parser.add_argument("--contrast", action="append", default=[], help="key=a,b, e.g. pos=learned,none (repeatable)")
    parser.add_argument("--metrics", type=_names, default=None, help="comma-separated metrics for study.md and the "
                        f"curves (default: {','.join(HEADLINE)})")
    parser.add_argument("--steps", type=_steps, default=None,
                        help="comma-separated steps for study.md (default: 0, middle, last)")
    parser.add_argument("--layers", type=_names, default=None,
                        help=f"comma-separated layers (default: the last, {LAYER_MAX}, model)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--primary", type=_names, default=None, help="comma-separated metric@layer of the confirmatory "
                        "families (Holm), at the last step every cell reached, e.g. "
                        "hidden/argmax_share@layer_4,val/ppl@model: outlier measures form the primary family, "
                        "loss/accuracy/perplexity/order use their own (default: the experiment config's study_design, "
                        "else the outlier measures at max_layer)")
    parser.add_argument("--equivalence-margin", default=None, help="TOST margin: one number, or metric=margin,... "
                        "in the metric's units (default: the experiment config's study_design)")
    parser.add_argument("--allow-mixed-code", action="store_true", help="average cells of different code versions")
    parser.add_argument("--replicates", nargs="+", default=[], metavar="PATH",
                        help="more cells (folders or tables), read only to find replicates -- same resolved config and "
                        "seed -- of the groups that mix code versions; study.md reports each group's")
    parser.add_argument("--until", type=int, default=None, help="compare every cell up to this step, admitting the "
                        "training cells stopped before their budget (a wall-clock cut) whose numbers reach it")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from outlierlab.studies.report import console_lines

    a = build_parser().parse_args(argv)
    try:
        res = run(a.paths, a.out, a.contrast, a.metrics, a.steps, a.layers, plots=not a.no_plots, primary=a.primary,
                  equivalence_margin=a.equivalence_margin, allow_mixed_code=a.allow_mixed_code, until=a.until,
                  replicates=a.replicates)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    groups = ", ".join(f"{k} ({n} seeds)" for k, n in res["groups"].items())
    print(f"groups: {groups}")
    if res["unfinished"]:
        print(f"unfinished (left out): {', '.join(res['unfinished'])}")
    failed = [f"{name}: {line}" for name, line in res["failed"].items()]
    for what, lines in (("failed (left out)", failed), ("unusable (left out)", res["unusable"]),
                        ("note", res["notes"]), ("does not use token order", res["no_order_use"])):
        for line in lines:
            print(f"{what}: {line}")
    for group, rows in res["replicates"].items():
        if not rows.attrs.get("linked"):
            print(f"mixed code versions not linked by a replicate of its own configuration: {group}")
    for line in console_lines(res["contrasts"]):
        print(line)
    print(f"wrote {res['out']}/study.csv, study.md" + (f" and {len(res['plots'])} curves" if res["plots"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
