"""``study.md`` and the confidence-band curves of a seed study (``outlierlab.studies.aggregate``)."""

from __future__ import annotations

import io
import math
import re
import textwrap
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from outlierlab.metrics.word_order import ORDER_USE_THRESHOLD
from outlierlab.studies.seed_statistics import CI_METHOD, CONSTANT
from outlierlab.studies.study_inference import (CONFIRMATORY, DEFAULT_RULE, DUPLICATE, EXPLORATORY,
                                           EXPLORATORY_PERFORMANCE, NOT_TESTED, PERFORMANCE_FAMILY, PRIMARY,
                                           family_rules)
from outlierlab.jobs.run_state import failed_line
from outlierlab.utils.atomic import figure_bytes, write_atomic
from outlierlab.utils.tables import md_table


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    a = abs(x)
    return f"{x:.3g}" if a >= 100 or a < 0.01 and a > 0 else f"{x:.3f}"


def _pm(row: pd.Series) -> str:
    """``mean ± half-width`` for a symmetric (t) interval, ``mean [low, high]`` for a bounded one; n always."""
    mark = "*" if bool(row.get("n_below_seeds", False)) else ""
    n = f"(n={int(row['n'])}{mark})"
    if not math.isfinite(row["ci_high"]):
        note = " const" if row.get("ci") == CONSTANT else ""
        return f"{_fmt(row['mean'])}{note} {n}"
    if str(row.get("ci", CI_METHOD)).startswith("Student"):
        return f"{_fmt(row['mean'])} ± {_fmt(row['ci_high'] - row['mean'])} {n}"
    return f"{_fmt(row['mean'])} [{_fmt(row['ci_low'])}, {_fmt(row['ci_high'])}] {n}"


def _at_steps(table: pd.DataFrame, metrics: Sequence[str], layers: Sequence[str], steps: Sequence[int]):
    """``(metric, layer, step, rows)`` for every metric and layer ``table`` holds, at the recorded step nearest each of
    ``steps``: the rows study.md shows."""
    for metric in metrics:
        for layer in layers:
            sub = table[(table["metric"] == metric) & (table["layer"] == layer)] if not table.empty else table
            if sub.empty:
                continue
            available = sorted(sub["step"].unique())
            for near in sorted({min(available, key=lambda s: abs(s - step)) for step in steps}):
                yield metric, layer, near, sub[sub["step"] == near]


def n_tests(n: int) -> str:
    return f"{n} test" if n == 1 else f"{n} tests"


def _adjusted(r: pd.Series) -> str:
    """The row's corrected p-value, named by its correction and family."""
    family = r.get("family")
    if family in CONFIRMATORY:
        return f"{_fmt(r['p_holm'])} (Holm{', performance' if family == PERFORMANCE_FAMILY else ''})"
    if family in (EXPLORATORY, EXPLORATORY_PERFORMANCE):
        return f"{_fmt(r['q_bh'])} (BH, {family})"
    return str(family) if isinstance(family, str) else "–"


def console_lines(contrasts: Mapping[str, pd.DataFrame]) -> list[str]:
    """What the aggregator prints of each contrast: its confirmatory rows (the primary and performance families:
    the tests a claim rests on), one line each, and how many exploratory rows study.md and contrasts.csv hold."""
    lines = []
    for spec, table in contrasts.items():
        if table.empty:
            lines.append(f"contrast {spec}: no rows (the groups share no metric at any step)")
            continue
        tests = table[table["family"].isin(CONFIRMATORY)].sort_values(["family", "metric", "layer"])
        lines.append(f"contrast {table['contrast'].iloc[0]}: {n_tests(len(tests))} in the primary and "
                     "performance families" + (":" if len(tests) else ""))
        for _, r in tests.iterrows():
            n = f"{int(r['n_pairs'])} pairs" if r["test"] == "paired t" else f"n {int(r['n_a'])}+{int(r['n_b'])}"
            lines.append(f"  {r['metric']}@{r['layer']} step {int(r['step'])}: diff {_fmt(r['diff'])} "
                         f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}], p {_fmt(r['p_value'])}, "
                         f"p_holm {_fmt(r['p_holm'])} ({r['family']}), {n}, {r['ordering']}")
        for family in (EXPLORATORY, EXPLORATORY_PERFORMANCE):
            rows = table[table["family"] == family]
            if len(rows):
                lines.append(f"  {family}: {len(rows)} rows, {int((rows['q_bh'] < 0.05).sum())} with BH q < 0.05 "
                             "(study.md, contrasts.csv)")
    return lines


def _design_lines(design: Mapping | None, contrasts: Mapping[str, pd.DataFrame]) -> list[str]:
    if not contrasts:
        return []
    joined = pd.concat(contrasts.values(), ignore_index=True)
    sizes = joined["family"].value_counts().to_dict() if "family" in joined else {}
    design = design or {}
    rules = family_rules({"primary": design.get("primary", [])}, set(zip(joined.get("metric", []), joined.get("layer", []))))
    where = ", ".join(design.get("primary_contrasts") or []) or "every contrast below"

    def listed(pairs) -> str:
        return ", ".join(f"{m}@{l}" for m, l in pairs) or "none"

    primary_rule = (DEFAULT_RULE if rules["default"] else
                    f"declared ({design.get('source', 'none declared')}), at the last step every cell reached")
    perf_rule = (f"declared ({design.get('source')}), at the last step every cell reached" if rules["performance"]
                 else "none declared")

    def significant(family: str, column: str) -> int:
        sub = joined[joined["family"] == family] if "family" in joined else joined.iloc[:0]
        return int((sub[column] < 0.05).sum())

    lines = ["", "## Families and corrections", "",
             "Corrections are made within a family, never across. Loss, accuracy, perplexity and order use are never "
             "in the family of an outlier claim. Per-step rows before the last step are curves: exploratory, not "
             "confirmatory tests. Pairs match on each cell's resolved `seed` (the seed the run used).", "",
             f"* **primary (outlier claims): {n_tests(sizes.get(PRIMARY, 0))}** — rule: {primary_rule}; metrics: "
             f"{listed(rules['primary'])}; in {where}. Holm-adjusted p (`p_holm`, family-wise 5%; "
             f"{significant(PRIMARY, 'p_holm')} below 0.05) and BH q within it (`q_bh`).",
             f"* **performance: {n_tests(sizes.get(PERFORMANCE_FAMILY, 0))}** — rule: {perf_rule}; metrics: "
             f"{listed(rules['performance'])}. Holm and BH within it ({significant(PERFORMANCE_FAMILY, 'p_holm')} "
             "with Holm p below 0.05).",
             f"* **exploratory: {n_tests(sizes.get(EXPLORATORY, 0))}** — every other outlier and geometry row (other "
             f"layers, contrasts and steps); Benjamini–Hochberg q within the exploratory rows "
             f"({significant(EXPLORATORY, 'q_bh')} below 0.05).",
             f"* **exploratory performance: {n_tests(sizes.get(EXPLORATORY_PERFORMANCE, 0))}** — every other loss, "
             f"accuracy, perplexity and order-use row; BH q within them ({significant(EXPLORATORY_PERFORMANCE, 'q_bh')}"
             " below 0.05).",
             f"* not tested: {sizes.get(NOT_TESTED, 0)} (constant across seeds or too few seeds: p is NaN, never 0); "
             f"duplicate: {sizes.get(DUPLICATE, 0)} (a post-hoc row of a statistic the live monitor recorded at the "
             "same step) — in no family.", "",
             "Confirmatory claims rest on `p_holm` of their family; exploratory rows are leads, with `q_bh` within "
             "their family, never the raw p. `mde`: the smallest "
             "difference a two-sided t-test at 5% detects with 80% power at this n (paired: from the sd of the "
             "per-seed differences); a difference inside ±mde that is not significant is absence of evidence. "
             "`tost_p`: two one-sided tests against ±margin (equivalence shown where < 0.05)."]
    return lines


def write_markdown(path: Path, sources: Sequence[str], summary: pd.DataFrame, contrasts: Mapping[str, pd.DataFrame],
                   groups: Mapping[str, list], unfinished: list, metrics: Sequence[str], steps: Sequence[int],
                   layers: Sequence[str], unusable: Sequence = (), notes: Sequence[str] = (),
                   design: Mapping | None = None, no_order_use: Sequence[str] = (),
                   replicates: Sequence[str] = (), failed: Mapping[str, dict] | None = None) -> Path:
    lines = [f"# Study: {', '.join(map(str, sources))}", "",
             f"Every number: the mean over seeds with its 95% confidence interval, n = seeds. Unbounded measures: "
             f"± the half-width of the {CI_METHOD} interval (n − 1 degrees of freedom). Bounded measures (shares in "
             "[0, 1], cosines in [−1, 1]): [low, high], a bootstrap percentile interval over seeds when n ≥ 5, else "
             "a t interval on the logit / Fisher-z scale mapped back (`ci` column of study.csv). `const`: the same "
             "value in every seed (no interval). `*`: fewer seeds than the group holds (`n_below_seeds`). "
             "`max_layer`: the largest value over the encoder layers, taken within each run before averaging.", "",
             "## Groups", "", "Seeds: each cell's resolved `seed` (the seed its run used).", "", "| group | seeds | code | cells |", "|---|---|---|---|"]
    for label, cells in groups.items():
        seeds = ", ".join(str(c.seed) for c in sorted(cells, key=lambda c: (c.seed is None, c.seed)))
        codes = ", ".join(sorted({c.code for c in cells}))
        lines.append(f"| {label} | {seeds} | {codes} | {', '.join(c.path.name for c in cells)} |")
    failed = failed or {}
    still = [c for c in unfinished if c.path.name not in failed]
    if still:
        lines += ["", f"**Unfinished, left out ({len(still)}):** " + ", ".join(c.path.name for c in still)]
    if failed:
        lines += ["", f"**Failed, left out ({len(failed)}):** the last attempt's error (`failed.json`)", ""]
        lines += [f"* {name}: {failed_line(f)}" for name, f in failed.items()]
    if unusable:
        lines += ["", f"**Unusable, left out ({len(unusable)}):**", ""]
        lines += [f"* {p}" for c in unusable for p in c.problems]
    unknown = [n for n in notes if "no manifest" in n]
    resumed = [n for n in notes if "with other settings" in n]  # cell_checks.resumed_with_changes
    stopped = [n for n in notes if n not in unknown and n not in resumed]  # admitted by --until (admit_cut)
    if unknown:
        lines += ["", f"**Notes:** {len(unknown)} cells have no manifest: code version unknown ("
                  + ", ".join(n.split(':')[0] for n in unknown) + ")."]
    if resumed:
        lines += ["", f"**Resumed with other settings ({len(resumed)}):** the cell's config.yaml states the last "
                  "start's (`code_versions.jsonl`)", ""] + [f"* {n}" for n in resumed]
    if stopped:
        lines += ["", f"**Stopped before their budget, compared up to a step every cell reached ({len(stopped)}):**",
                  ""] + [f"* {n}" for n in stopped]
    if no_order_use:
        lines += ["", f"**Does not use token order ({len(no_order_use)}):** order use (permuted-block loss minus "
                  f"intact loss) below {ORDER_USE_THRESHOLD} nats at the cell's last step -- not yet, or (as marked) "
                  "cannot -- so a position-scheme contrast with these cells compares bag-of-words models "
                  "(docs/order_use.md).", ""]
        lines += [f"* {line}" for line in no_order_use]
    lines += list(replicates)  # outlierlab.studies.replicates.markdown: empty unless a group mixes code versions
    lines += _design_lines(design, contrasts)
    group_names = list(groups)
    lines += ["", "## Headline metrics", ""]
    body = []
    for metric, layer, near, rows in _at_steps(summary, metrics, layers, steps):
        by_group = [rows[rows["group"] == g] for g in group_names]
        body.append([metric, layer, near, *(_pm(r.iloc[0]) if len(r) else "–" for r in by_group)])
    lines.append(md_table(["metric", "layer", "step", *group_names], body, cell=str))
    for spec, table in contrasts.items():
        lines += ["", f"## Contrast {spec}", "",
                  "diff = a − b with its 95% CI: a paired t interval over the per-seed differences of the seeds both "
                  "groups hold (n = pairs), Welch's only when they share fewer than two seeds. *ordering*: in how "
                  "many seeds a − b has the sign of the mean difference (paired), or whether the two groups' runs "
                  "overlap (Welch); pairs match on the cells' resolved seeds. A difference of two bounded measures "
                  "(shares, cosines) has its interval clipped at the range the difference can take (said in the "
                  "row). p: raw; p_holm / q_bh: corrected within the row's family (section above).", "",
                  "| metric | layer | step | a | b | mean a | mean b | diff [95% CI] | n | p | p_holm / q_bh | mde | tost_p | ordering |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for metric, layer, near, rows in _at_steps(table, metrics, layers, steps):
            for _, r in rows.iterrows():
                n = int(r["n_pairs"]) if r["test"] == "paired t" else f"{int(r['n_a'])}+{int(r['n_b'])}"
                lines.append(f"| {metric} | {layer} | {near} | {r['group_a']} | {r['group_b']} | "
                             f"{_fmt(r['mean_a'])} | {_fmt(r['mean_b'])} | {_fmt(r['diff'])} "
                             f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] | {n}{'*' if r['n_below_seeds'] else ''} | "
                             f"{_fmt(r['p_value'])} | {_adjusted(r)} | {_fmt(r.get('mde'))} | "
                             f"{_fmt(r.get('tost_p'))} | {r['ordering']}"
                             f"{'; ' + r['note'] if isinstance(r.get('note'), str) and r['note'] else ''} |")
    lines += ["", "All metrics, steps and layers: `study.csv`" + (" and `contrasts.csv`." if contrasts else "."), ""]
    write_atomic(path, "\n".join(lines))
    return path


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", name)


def _wrapped(text: str, width: int, max_lines: int = 3) -> str:
    """``text`` in lines of at most ``width`` characters, broken after commas and slashes where possible, cut
    with "…" after ``max_lines``: a group label is every override of its cells when one group is plotted
    (hundreds of characters with a data path), and matplotlib's legend and title do not wrap — unwrapped, the
    legend outgrew the figure and tight_layout squeezed the axes into a sliver."""
    mark = "\ue000"  # textwrap breaks at spaces only: a marked one after each , and / that has none, removed after
    spaced = re.sub(r"([,/])(?=\S)", "\\1" + mark + " ", text)
    lines = textwrap.wrap(spaced, width, break_on_hyphens=False, max_lines=max_lines, placeholder=" …")
    return "\n".join(line.replace(mark + " ", "").replace(mark, "") for line in lines)


def save_palette_png(fig: Figure, out: Path, colors: int = 64) -> None:
    """``fig`` as a palette PNG of ``colors`` colours: a line plot holds a few dozen, and an RGBA PNG of one is about
    four times the bytes (curves are committed with the studies they show). Pillow does the quantizing (matplotlib's
    own dependency)."""
    from PIL import Image

    png = io.BytesIO()
    with Image.open(io.BytesIO(figure_bytes(fig))) as im:
        im.convert("RGB").quantize(colors=colors).save(png, format="png", optimize=True)
    write_atomic(Path(out), png.getvalue())  # a kill mid-write leaves the earlier curve, never a cut one


def write_curves(folder: Path, summary: pd.DataFrame, per_seed: pd.DataFrame, metrics: Sequence[str],
                 layers: Sequence[str]) -> list[Path]:
    """One PNG per metric x layer: per group the mean over seeds with its CI band, each seed faintly behind."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in metrics:
        for layer in layers:
            sub = summary[(summary["metric"] == metric) & (summary["layer"] == layer) & (summary["step"] >= 0)]
            if sub["step"].nunique() < 2:
                continue
            fig = Figure(figsize=(6.4, 4.0), dpi=110)
            FigureCanvasAgg(fig)
            ax = fig.add_subplot()
            for i, (group, g) in enumerate(sub.groupby("group", sort=True)):
                color = f"C{i % 10}"
                raw = per_seed[(per_seed["group"] == group) & (per_seed["metric"] == metric) & (per_seed["layer"] == layer)]
                for _, seed_rows in raw.groupby("seed"):
                    seed_rows = seed_rows.sort_values("step")
                    ax.plot(seed_rows["step"], seed_rows["value"], color=color, alpha=0.25, lw=0.8)
                g = g.sort_values("step")
                ax.plot(g["step"], g["mean"], color=color, lw=2, label=f"{_wrapped(group, 60, 2)} (n={int(g['n'].max())})")
                ax.fill_between(g["step"], g["ci_low"], g["ci_high"], color=color, alpha=0.18, lw=0)
            ax.set(xlabel="step", ylabel=_wrapped(metric, 40, 2))
            ax.set_title(_wrapped(f"{metric} — {layer} (mean, 95% t CI, seeds faint)", 70, 2), fontsize=10)
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            out = folder / f"{_safe(metric)}__{_safe(layer)}.png"
            fig.tight_layout()
            save_palette_png(fig, out)
            written.append(out)
    return written
