"""The result tables of the docs, generated from committed study outputs instead of transcribed.

A doc marks each generated block::

    <!-- generated: emergence_seeds -->
    ... (replaced) ...
    <!-- end generated -->

and ``python -m outlierlab.studies.doc_tables docs/emergence.md docs/findings.md`` rewrites every block from
:data:`TABLES` (``--check``: exit 1 naming each block that differs from what the committed CSVs give, as the tests
do). Every table reads ``study.csv`` / ``contrasts.csv`` written by ``python -m outlierlab.studies.aggregate`` (committed
compressed, the contrasts' per-step curves only where a page reads them, and each family's full counts in
``families.csv``: :mod:`outlierlab.studies.committed`) and, for per-seed rows, the cells' own CSVs
(:func:`outlierlab.studies.cells.cell_numbers`).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SEEDS = "docs/emergence/seeds"
SWITCH = "docs/emergence/switch_seeds"
EVALUATE = "docs/emergence/seeds_evaluate"
OBJECTIVES = "docs/objectives/cells"
#: The same two seed studies with 5 seeds, on one GPU and one code version
SEEDS_GPU = "docs/emergence/seeds_gpu"
SWITCH_GPU = "docs/emergence/switch_seeds_gpu"
#: The order-use studies (docs/order_use.md): learned vs none, every scheme, the causal pair on english_large
ORDER_USE = "docs/order_use"


def cells_of(study: str) -> Path:
    """Where a study's cells are read from: its table ``<study>.parquet`` (:mod:`outlierlab.studies.table`), or
    the folder of run directories itself where none was packed."""
    table = ROOT / f"{study}.parquet"
    return table if table.is_file() else ROOT / study


def _shown(path: Path) -> str:
    """``path`` as the docs name it: relative to the repository (a table ``x.parquet`` or a folder)."""
    return str(path.relative_to(ROOT))


BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)

#: The primary quantities of the seed studies, in the order the docs show them.
PRIMARY = [("hidden/argmax_share", "layer_4", "argmax share"), ("hidden/abs_argmax_share", "layer_4", "\\|x\\| argmax share"),
           ("hidden/kurtosis", "layer_4", "kurtosis (1 = flat)"), ("hidden/max_median", "layer_4", "max / median"),
           ("hidden/token_pair_cosine", "layer_4", "anisotropy (1,000 pairs)"), ("val/ppl", "model", "val perplexity")]


def fmt(x: float, digits: int = 2) -> str:
    if x is None or not math.isfinite(float(x)):
        return "–"
    x = float(x)
    if x != 0 and abs(x) < 0.01:
        return f"{x:.1e}".replace("-", "−")
    places = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else digits
    return f"{x:.{places}f}".replace("-", "−")


def signed(x: float) -> str:
    return ("+" if math.isfinite(x) and x > 0 else "") + fmt(x)


def _source(path: str) -> str:
    """``path``, or ``path.xz`` / ``path.gz`` where the docs keep the aggregator's CSV compressed
    (:mod:`outlierlab.studies.committed`)."""
    for candidate in (path, f"{path}.xz", f"{path}.gz"):
        if (ROOT / candidate).is_file():
            return candidate
    return path


@lru_cache(maxsize=None)
def _read(path: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / _source(path))


def summary_cell(study: str, group: str, metric: str, layer: str, step: int | None = None) -> str:
    """``mean ± t half-width`` or ``mean [low, high]`` (bounded measures), at ``step`` (default: the last)."""
    s = _read(f"{study}/study/study.csv")
    sub = s[(s["group"] == group) & (s["metric"] == metric) & (s["layer"] == layer)]
    r = sub[sub["step"] == (sub["step"].max() if step is None else step)].iloc[0]
    if not math.isfinite(r["ci_low"]):
        return fmt(r["mean"])
    if str(r["ci"]).startswith("Student"):
        return f"{fmt(r['mean'])} ± {fmt(r['ci_high'] - r['mean'])}"
    return f"{fmt(r['mean'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]"


def contrast_at(folder: str, contrast: str | None, metric: str, layer: str, step: int | None = None) -> pd.Series | None:
    """The first row of ``<folder>/contrasts.csv`` of ``contrast`` (None: any) on ``metric`` and ``layer`` at ``step``
    (default: the series' last), or None where it has none. Every table reads its contrasts rows here (but for
    :func:`switch_seeds_all_measures`' last-step rows and :func:`families_line`'s counts): the committed file keeps
    the per-step curves only at their last step and in the series read at earlier steps
    (:data:`outlierlab.studies.committed.CONTRASTS_READ`, whose table entries a test derives from these calls)."""
    c = _read(f"{folder}/contrasts.csv")
    sub = c[(c["metric"] == metric) & (c["layer"] == layer) & ((c["contrast"] == contrast) if contrast else True)]
    sub = sub[sub["step"] == (sub["step"].max() if step is None else step)]
    return None if sub.empty else sub.iloc[0]


def contrast_row(study: str, contrast: str, metric: str, layer: str, step: int | None = None) -> pd.Series:
    return contrast_at(f"{study}/study", contrast, metric, layer, step)


#: The families whose rows carry a Holm p (confirmatory) and those with a BH q only (the study aggregator's,
#: :mod:`outlierlab.studies.families`; "secondary" is the pooled BH family of studies written before).
HOLM_FAMILIES = ("primary", "performance")
BH_FAMILIES = ("exploratory", "exploratory performance", "secondary")


def _adjusted(r: pd.Series) -> str:
    if r["family"] in HOLM_FAMILIES:
        return f"{fmt(r['p_holm'], 3)} (Holm{'' if r['family'] == 'primary' else ', ' + r['family']})"
    if r["family"] in BH_FAMILIES:
        return f"{fmt(r['q_bh'], 3)} (BH{'' if r['family'] == 'secondary' else ', ' + r['family']})"
    return str(r["family"])


def _seeds_word(r: pd.Series) -> str:
    m = re.match(r"(\d+)/(\d+) seeds a ([<>]) b", str(r["ordering"]))
    return f"{m.group(1)}/{m.group(2)} {m.group(3)}" if m else str(r["ordering"])


def families_line(study: str, after_step: int = 1) -> str:
    """Each family's size and rejections in the full contrasts table of ``<study>/study`` (and from ``after_step``
    on), from its ``families.csv`` (:func:`outlierlab.studies.committed.family_counts`): the committed
    contrasts.csv keeps only part of the exploratory and not-tested rows."""
    path = f"{study}/study/families.csv"
    counts = _read(path)

    def total(family: str, column: str = "rows", since: int = 0) -> int:
        return int(counts.loc[(counts["family"] == family) & (counts["step"] >= since), column].sum())

    if "secondary" in set(counts["family"]):  # a study written before the declared families
        return (f"Families ({_source(path)}): primary {total('primary')} contrasts, "
                f"{total('primary', 'p_holm_below_05')} with Holm p < 0.05; secondary {total('secondary')}, "
                f"{total('secondary', 'q_bh_below_05')} with BH q < 0.05 ({total('secondary', since=after_step)} from "
                f"step {after_step:,} on, {total('secondary', 'q_bh_below_05', after_step)} with q < 0.05; raw p < 0.05: "
                f"{total('secondary', 'p_below_05', after_step)}); not tested (constant or one seed) "
                f"{total('not tested')}, post-hoc duplicates of a monitor row {total('duplicate')}.")
    parts = []
    for family in HOLM_FAMILIES:
        n = total(family)
        parts.append(f"{family} {n} test{'' if n == 1 else 's'}, {total(family, 'p_holm_below_05')} with Holm p < 0.05")
    for family in BH_FAMILIES[:2]:
        parts.append(f"{family} {total(family)}, {total(family, 'q_bh_below_05')} with BH q < 0.05 within it "
                     f"({total(family, since=after_step)} from step {after_step:,} on, "
                     f"{total(family, 'q_bh_below_05', after_step)} with q < 0.05; "
                     f"raw p < 0.05: {total(family, 'p_below_05', after_step)})")
    return (f"Families ({_source(path)}, the full contrasts table), each corrected within itself: " + "; ".join(parts)
            + f"; not tested (constant or one seed) {total('not tested')}, post-hoc duplicates "
            f"of a monitor row {total('duplicate')}.")


def emergence_seeds(study: str = SEEDS) -> str:
    head = ["| quantity | learned | none | learned − none [95% CI] | n | p | adjusted p | MDE (80%) | TOST p (margin) | seeds |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for metric, layer, label in PRIMARY:
        r = contrast_row(study, "pos: learned - none", metric, layer)
        head.append(f"| {label} | {summary_cell(study, 'pos=learned', metric, layer)} | "
                    f"{summary_cell(study, 'pos=none', metric, layer)} | {signed(r['diff'])} [{fmt(r['ci_low'])}, "
                    f"{fmt(r['ci_high'])}] | {int(r['n_pairs'])} | {fmt(r['p_value'], 3)} | {_adjusted(r)} | {fmt(r['mde'])} | "
                    f"{fmt(r['tost_p'], 3)} (±{fmt(r['margin'])}) | {_seeds_word(r)} |")
    return "\n".join(head + ["", families_line(study, 1000)])


def _cell_table(study: str, group_key: str, labels: dict[str, str]) -> pd.DataFrame:
    from outlierlab.studies.cells import cell_numbers, find_cells

    frames = []
    for cell in find_cells([cells_of(study)]):
        if not cell.usable:
            continue
        df = cell_numbers(cell)
        df["group"], df["seed"] = labels.get(cell.overrides.get(group_key), cell.overrides.get(group_key)), cell.seed
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def _last(df: pd.DataFrame, metric: str, layer: str) -> pd.Series:
    sub = df[(df["metric"] == metric) & (df["layer"] == layer)]
    return sub[sub["step"] == sub["step"].max()].set_index(["group", "seed"])["value"]


def emergence_seeds_per_seed() -> str:
    return _per_seed(SEEDS, "pos")


def switch_seeds_per_seed() -> str:
    return _per_seed(SWITCH, "arch")


def _per_seed(study: str, key: str) -> str:
    df = _cell_table(study, key, {})
    cols = [("hidden/argmax_share", "layer_4", "argmax share"), ("hidden/abs_argmax_share", "layer_4", "\\|x\\| argmax share"),
            ("hidden/kurtosis", "layer_4", "kurtosis"), ("hidden/max_median", "layer_4", "max/median"),
            ("hidden/token_pair_cosine", "layer_4", "anisotropy"), ("hidden/inf_norm_ln_input", "max_layer", "inf-norm LN input (max layer)"),
            ("hidden/inf_norm_ffn_output", "layer_4", "inf-norm FFN out (layer 4)"), ("val/ppl", "model", "val ppl")]
    values = {c: _last(df, m, l) for m, l, c in cols}
    ln = df[(df["metric"] == "posthoc/n_layernorm_outliers") & df["layer"].str.fullmatch(r"layer_[1-9]\d*")]
    ln = ln[ln["step"] == ln["step"].max()].groupby(["group", "seed"])["value"].sum()
    lines = [f"| {key} | seed | " + " | ".join(c for *_, c in cols) + " | LayerNorm 3σ dims (sum over layers) |",
             "|---|---|" + "---|" * (len(cols) + 1)]
    for key in sorted(values["val ppl"].index):
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(fmt(values[c].get(key, math.nan)) for *_, c in cols)
                     + f" | {int(ln.get(key, 0))} |")
    return "\n".join(lines)


def emergence_seeds_gpu() -> str:
    return emergence_seeds(SEEDS_GPU)


def switch_seeds_gpu() -> str:
    return switch_seeds(SWITCH_GPU)


def switch_seeds(study: str = SWITCH) -> str:
    lines = ["| quantity | plain (default) | OP | pre-LN | plain − OP [95% CI], p, adjusted p, MDE, TOST p (margin), seeds | "
             "plain − pre-LN [95% CI], p, adjusted p, seeds |", "|---|---|---|---|---|---|"]
    for metric, layer, label in PRIMARY:
        op = contrast_row(study, "arch: default - op", metric, layer)
        pre = contrast_row(study, "arch: default - pre_ln", metric, layer)
        lines.append(f"| {label} | " + " | ".join(summary_cell(study, f"arch={a}", metric, layer) for a in ("default", "op", "pre_ln"))
                     + f" | {signed(op['diff'])} [{fmt(op['ci_low'])}, {fmt(op['ci_high'])}], {fmt(op['p_value'], 3)}, "
                       f"{_adjusted(op)}, {fmt(op['mde'])}, {fmt(op['tost_p'], 3)} (±{fmt(op['margin'])}), {_seeds_word(op)} | {signed(pre['diff'])} [{fmt(pre['ci_low'])}, "
                       f"{fmt(pre['ci_high'])}], {fmt(pre['p_value'], 3)}, {_adjusted(pre)}, {_seeds_word(pre)} |")
    return "\n".join(lines + ["", families_line(study, 1000)])


def switch_seeds_all_measures() -> str:
    """Every monitor measure of the last layer, plain vs OP: where the direction holds and where it does not."""
    c = _read(f"{SWITCH}/study/contrasts.csv")
    sub = c[(c["contrast"] == "arch: default - op") & (c["layer"] == "layer_4") & c["metric"].str.startswith("hidden/")]
    # a row at the latest step of them all is its own series' last, which every committed contrasts.csv keeps
    sub = sub[sub["step"] == sub["step"].max()].sort_values("metric")
    lines = ["| measure (layer 4, step 2,000) | plain | OP | plain − OP | p | adjusted p | seeds |", "|---|---|---|---|---|---|---|"]
    for _, r in sub.iterrows():
        lines.append(f"| {r['metric'][len('hidden/'):]} | {fmt(r['mean_a'])} | {fmt(r['mean_b'])} | {signed(r['diff'])} | "
                     f"{fmt(r['p_value'], 3)} | {_adjusted(r)} | {_seeds_word(r)} |")
    return "\n".join(lines)


def seeds_evaluate() -> str:
    groups = {"learned": "encoder.name_or_path=multirun/emergence_seeds/pos=learned,seed=*",
              "none": "encoder.name_or_path=multirun/emergence_seeds/pos=none,seed=*"}
    rows = [("anisotropy/none/anisotropy", "anisotropy"), ("anisotropy/none/top3_share", "top-3 rogue-dim share"),
            ("isotropy/none/isoscore", "IsoScore"), ("anisotropy/whiten/anisotropy", "anisotropy after whitening")]
    lines = ["| layer 4 (evaluate.py, 1,000 sentences) | learned | none |", "|---|---|---|"]
    for metric, label in rows:
        lines.append(f"| {label} | " + " | ".join(summary_cell(EVALUATE, g, metric, "layer_4", -1) for g in groups.values()) + " |")
    return "\n".join(lines)


def readme_results() -> str:
    def line(study, contrast, what):
        parts = []
        for metric, layer, label in PRIMARY:
            r = contrast_row(study, contrast, metric, layer)
            parts.append(f"{label.replace(chr(92), '')} {signed(r['diff'])} (Holm p {fmt(r['p_holm'], 2)}, MDE {fmt(r['mde'])})")
        return f"* {what}: " + "; ".join(parts) + "."
    return "\n".join([line(SEEDS_GPU, "pos: learned - none", "`emergence_seeds`, learned − none, last layer, step 4,000, "
                           "5 seeds (one H100, one code version)"),
                      line(SWITCH_GPU, "arch: default - op", "`switch_seeds`, plain − OP, last layer, step 2,000, "
                           "5 seeds (one H100, one code version)"),
                      line(SEEDS, "pos: learned - none", "`emergence_seeds`, the earlier 3 CPU seeds (code unknown)"),
                      line(SWITCH, "arch: default - op", "`switch_seeds`, the earlier 3 CPU seeds (code unknown)")])


def objectives() -> str:
    """The masked-vs-causal study (docs/objectives.md): :mod:`outlierlab.studies.objectives_report` on its exported cells."""
    from outlierlab.studies import objectives_report

    if not cells_of(OBJECTIVES).exists():
        return f"No cells exported to {OBJECTIVES} yet."
    return objectives_report.report(cells_of(OBJECTIVES), source=_shown(cells_of(OBJECTIVES)))[1]


#: The rows of docs/order_use.md's learned-vs-none tables: (metric, layer) at the last step; the rest is in the
#: study's contrasts.csv.
ORDER_USE_ROWS = [("val/loss", "model"), ("val/ppl", "model"), ("val/order_use", "model"), ("val/acc", "model"),
                  ("val/attn_local/layer_0", "model"), ("hidden/kurtosis", "max_layer"),
                  ("hidden/argmax_share", "max_layer"), ("hidden/abs_argmax_share", "max_layer"),
                  ("hidden/max_median", "max_layer"), ("hidden/anisotropy", "layer_4"), ("hidden/isoscore", "layer_4"),
                  ("hidden/inf_norm_ffn_output", "max_layer"), ("layernorm/n_outlier_dims", "model"),
                  ("layernorm/max_abs_gain_div", "max_layer"), ("hidden/sink_share_bos", "max_layer")]
#: The outlier measures of the schemes table (at the last step), each beside its BH q against pos=none.
SCHEME_OUTLIER_ROWS = [("hidden/kurtosis", "max_layer"), ("hidden/abs_argmax_share", "max_layer"),
                       ("hidden/max_median", "max_layer"), ("hidden/inf_norm_ffn_output", "max_layer"),
                       ("hidden/anisotropy", "layer_4"), ("hidden/isoscore", "layer_4"),
                       ("layernorm/n_outlier_dims", "model")]


def _learned_none_rows(study: str) -> str:
    """One row per :data:`ORDER_USE_ROWS` entry of ``<study>/contrasts.csv`` at its last step: both means, the
    paired difference with its CI (and TOST where a margin was declared), the corrected p and the seeds' signs."""
    lines = ["| metric | layer | step | learned | none | diff [95% CI] | n pairs | p_holm / q_bh | seeds with the sign |",
             "|---|---|---|---|---|---|---|---|---|"]
    for metric, layer in ORDER_USE_ROWS:
        r = contrast_at(study, None, metric, layer)
        if r is None:
            continue
        corrected = f"{r['p_holm']:.3g} (Holm, {r['family']})" if pd.notna(r["p_holm"]) else (
            f"{r['q_bh']:.3g} (BH, {r['family']})" if pd.notna(r["q_bh"]) else "not tested")
        tost = f"; TOST ±{r['margin']:g}: p {r['tost_p']:.3g}" if pd.notna(r.get("tost_p")) else ""
        lines.append(f"| {metric} | {layer} | {int(r['step'])} | {r['mean_a']:.4g} | {r['mean_b']:.4g} | {r['diff']:.3g} "
                     f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}]{tost} | "
                     f"{int(r['n_pairs']) if pd.notna(r['n_pairs']) else '–'} | {corrected} | "
                     f"{str(r['ordering']).split(';')[0]} |")
    return "\n".join(lines)


def order_use_study() -> str:
    """Learned vs none in ``experiment=order_recipe``, the three finished pairs at 6,000 steps."""
    return _learned_none_rows(f"{ORDER_USE}/study")


def order_use_study_5seeds() -> str:
    """The same with the two learned cells cut by the clock: all five pairs at step 5,000."""
    return _learned_none_rows(f"{ORDER_USE}/study_5seeds")


def order_use_large() -> str:
    """The causal pair on ``data=english_large``, 5 seeds, 6,000 steps."""
    return _learned_none_rows(f"{ORDER_USE}/study_large")


def order_use_large_mlm() -> str:
    """The masked pair on ``data=english_large``, 5 seeds, 6,000 steps."""
    return _learned_none_rows(f"{ORDER_USE}/study_large_mlm")


def order_use_objectives_large() -> str:
    """Haviv's 2 x 2 on ``data=english_large``: the objectives report of the two folders of cells."""
    from outlierlab.studies import objectives_report

    folders = [f"{ORDER_USE}/cells_large_mlm", f"{ORDER_USE}/cells_large"]
    return objectives_report.report([cells_of(f) for f in folders],
                                    source=" ".join(_shown(cells_of(f)) for f in folders))[1]


def _scheme_rows(study: str = "study_schemes") -> tuple[pd.DataFrame, list[str]]:
    c = _read(f"{ORDER_USE}/{study}/contrasts.csv")
    return c, [name.split(":")[1].split("-")[0].strip() for name in dict.fromkeys(c["contrast"])]


def _scheme_at(study: str, scheme: str, metric: str, layer: str, step: int | None = None) -> pd.Series:
    return contrast_at(f"{ORDER_USE}/{study}", f"pos: {scheme} - none", metric, layer, step)


def order_use_schemes(study: str = "study_schemes") -> str:
    """Every scheme against pos=none: val loss and order use with their Holm p, accuracy, and the order use at each
    earlier validation (the aggregator's contrasts ``pos: <scheme> - none``)."""
    c, schemes = _scheme_rows(study)
    steps = sorted(c.loc[c["metric"] == "val/order_use", "step"].unique())[:-1]
    lines = ["| pos | val loss | - none [95% CI], Holm p | order use | - none [95% CI], Holm p | acc | order use at "
             + ", ".join(f"{s + 1:,}" for s in steps) + " |", "|---|---|---|---|---|---|---|"]
    for scheme in schemes:
        loss, use, acc = (_scheme_at(study, scheme, m, "model") for m in ("val/loss", "val/order_use", "val/acc"))
        early = " / ".join(f"{_scheme_at(study, scheme, 'val/order_use', 'model', s)['mean_a']:.2f}" for s in steps)
        lines.append(f"| {scheme} | {loss['mean_a']:.3f} | {loss['diff']:.2f} [{loss['ci_low']:.2f}, "
                     f"{loss['ci_high']:.2f}], {loss['p_holm']:.2g} | {use['mean_a']:.2f} | {use['diff']:.2f} "
                     f"[{use['ci_low']:.2f}, {use['ci_high']:.2f}], {use['p_holm']:.2g} | {acc['mean_a']:.3f} | {early} |")
    ref = {m: _scheme_at(study, schemes[0], m, "model")["mean_b"] for m in ("val/loss", "val/order_use", "val/acc")}
    lines.append(f"| none | {ref['val/loss']:.3f} | | {ref['val/order_use']:.4f} | | {ref['val/acc']:.3f} | |")
    return "\n".join(lines)


def order_use_schemes_outliers(study: str = "study_schemes") -> str:
    """The outlier measures of every scheme at the last step, each with its BH q against pos=none (bold below 0.05)."""
    _, schemes = _scheme_rows(study)
    lines = ["| pos | " + " | ".join(f"{m.split('/')[1]} ({layer})" for m, layer in SCHEME_OUTLIER_ROWS) + " |",
             "|---|" + "---|" * len(SCHEME_OUTLIER_ROWS)]
    for scheme in schemes:
        cells = []
        for metric, layer in SCHEME_OUTLIER_ROWS:
            r = _scheme_at(study, scheme, metric, layer)
            confirmatory = r["family"] in HOLM_FAMILIES  # a confirmatory row: its Holm p; else its family's q
            value = r["p_holm"] if confirmatory else r["q_bh"]
            q = (f"Holm p {value:.2g}" if confirmatory else f"q {value:.2g}") if pd.notna(value) else "not tested"
            bold = pd.notna(value) and value < 0.05
            cells.append(f"**{r['mean_a']:.3g}** ({q})" if bold else f"{r['mean_a']:.3g} ({q})")
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    lines.append("| none | " + " | ".join(f"{_scheme_at(study, schemes[0], m, layer)['mean_b']:.3g}"
                                          for m, layer in SCHEME_OUTLIER_ROWS) + " |")
    return "\n".join(lines)


def order_use_schemes_large() -> str:
    """:func:`order_use_schemes` for the masked schemes on ``data=english_large``."""
    return order_use_schemes("study_schemes_large")


def order_use_schemes_large_outliers() -> str:
    """:func:`order_use_schemes_outliers` for the masked schemes on ``data=english_large``."""
    return order_use_schemes_outliers("study_schemes_large")


def order_use_schemes_large_5seeds() -> str:
    """:func:`order_use_schemes` on ``data=english_large`` with seeds 4-5 added, every cell at step 4,000."""
    return order_use_schemes("study_schemes_large_5seeds")


def order_use_schemes_large_5seeds_outliers() -> str:
    """:func:`order_use_schemes_outliers` on ``data=english_large`` with seeds 4-5 added, at step 4,000."""
    return order_use_schemes_outliers("study_schemes_large_5seeds")


def order_use_objectives() -> str:
    """Haviv's 2 x 2 where the masked model uses its positions (docs/order_use.md): each group's mean at the last
    step of ``study_objectives/study.csv`` -- val loss and perplexity, order use with its 95 % interval (0 shown
    bare where every seed is 0 to four decimals), layer-4 anisotropy and the |x| argmax share of the most
    concentrated layer."""
    s = _read(f"{ORDER_USE}/study_objectives/study.csv")

    def at(group: str, metric: str, layer: str) -> pd.Series:
        sub = s[(s["group"] == group) & (s["metric"] == metric) & (s["layer"] == layer)]
        return sub.loc[sub["step"].idxmax()]

    lines = ["| objective | pos | val loss | val ppl | order use (nats) [95% CI] | anisotropy, layer 4 | "
             "abs argmax share, max layer |", "|---|---|---|---|---|---|---|"]
    for objective in ("mlm", "clm"):
        for pos in ("learned", "none"):
            g = f"objective={objective},pos={pos}"
            use, ppl = at(g, "val/order_use", "model"), at(g, "val/ppl", "model")["mean"]
            # a masked LM without positions: 0 by construction, shown without a meaningless interval
            zero = max(abs(use["ci_low"]), abs(use["ci_high"])) < 1e-3
            use_text = f"{use['mean']:.4f}" if zero else f"{use['mean']:.2f} [{use['ci_low']:.2f}, {use['ci_high']:.2f}]"
            loss, ppl_text = at(g, "val/loss", "model")["mean"], f"{ppl:.0f}" if ppl >= 100 else f"{ppl:.1f}"
            aniso = at(g, "hidden/anisotropy", "layer_4")["mean"]
            share = at(g, "hidden/abs_argmax_share", "max_layer")["mean"]
            lines.append(f"| {objective} | {pos} | {loss:.3f} | {ppl_text} | {use_text} | {aniso:.3f} | {share:.3f} |")
    return "\n".join(lines)


#: One run of examples/sentence_transformers_finetune.py (docs/loop_monitors.md): the monitor's CSV, committed.
MINILM_WIC = "docs/loop_monitors/minilm_wic/hidden_states.csv"


def minilm_wic_finetune() -> str:
    """The sentence-vector order change of every layer of all-MiniLM-L6-v2 and its last layer's anisotropy and
    activation kurtosis, at the first, middle and last record of the contrastive fine-tune."""
    h = _read(MINILM_WIC)
    steps = sorted(h["step"].unique())
    steps = [steps[0], steps[len(steps) // 2], steps[-1]]
    layers = sorted(h.loc[h["statistic"] == "pooled_order_change", "name"].unique(), key=lambda n: int(n.split("_")[1]))

    def at(step: int, statistic: str, layer: str) -> float:
        sub = h[(h["step"] == step) & (h["statistic"] == statistic) & (h["name"] == layer)]
        return float(sub["value"].iloc[0])

    last = layers[-1]
    lines = ["| step | order change, " + " / ".join(f"layer {n.split('_')[1]}" for n in layers)
             + f" | anisotropy, layer {last.split('_')[1]} | kurtosis, layer {last.split('_')[1]} |", "|---|---|---|---|"]
    for step in steps:
        change = " / ".join(f"{at(step, 'pooled_order_change', n):.4f}" for n in layers)
        lines.append(f"| {step} | {change} | {at(step, 'anisotropy', last):.3f} | {at(step, 'kurtosis', last):.3f} |")
    return "\n".join(lines)


def order_use_dim_identity_objectives() -> str:
    """:func:`order_use_dim_identity` of the causal and masked pairs on ``data=english_large`` (5 seeds, 6,000 steps)."""
    return order_use_dim_identity("dim_identity_objectives_large")


def order_use_dim_identity(folder: str = "dim_identity_large_4000") -> str:
    """Which dimension, since when (:mod:`outlierlab.studies.dim_identity`), every scheme on ``data=english_large`` at
    step 4,000 (5 seeds): per layer 1-4, the mean |x| argmax share, the median held fraction and the seeds whose
    layer ends on the previous layer's dimension."""
    from outlierlab.studies.dim_identity import summary

    s = summary(_read(f"{ORDER_USE}/{folder}/dim_identity.csv"))
    layers = [1, 2, 3, 4]
    lines = ["| objective, pos | " + " | ".join(f"layer {n}: share · held · as {n - 1}" for n in layers) + " |",
             "|---|" + "---|" * len(layers)]
    for (objective, pos), g in s.groupby(["objective", "pos"], sort=True):
        g = g.set_index("layer")
        lines.append(f"| {objective}, {pos} | " + " | ".join(f"{g.at[n, 'share']:.2f} · {g.at[n, 'held_fraction']:.2f} · "
                                                f"{g.at[n, 'as_previous']}/{g.at[n, 'seeds']}" for n in layers) + " |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {f.__name__: f for f in (emergence_seeds, emergence_seeds_per_seed, switch_seeds, switch_seeds_per_seed,
                                                                switch_seeds_all_measures, seeds_evaluate, readme_results,
                                                                objectives, emergence_seeds_gpu, switch_seeds_gpu,
                                                                order_use_study, order_use_study_5seeds, order_use_large,
                                                                order_use_schemes, order_use_schemes_outliers,
                                                                order_use_objectives, order_use_large_mlm,
                                                                order_use_objectives_large, order_use_schemes_large,
                                                                order_use_schemes_large_outliers,
                                                                order_use_schemes_large_5seeds,
                                                                order_use_schemes_large_5seeds_outliers,
                                                                minilm_wic_finetune, order_use_dim_identity,
                                                                order_use_dim_identity_objectives)}


def render(text: str, source: str = "") -> str:
    def one(m: re.Match) -> str:
        name = m.group(2)
        if name not in TABLES:
            raise ValueError(f"{source}: unknown generated table {name!r} (known: {', '.join(TABLES)})")
        return m.group(1) + TABLES[name]().rstrip("\n") + "\n" + m.group(4)
    return BLOCK.sub(one, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m outlierlab.studies.doc_tables", description=__doc__.split("\n")[0])
    parser.add_argument("docs", nargs="+")
    parser.add_argument("--check", action="store_true", help="exit 1 if a block differs from the committed CSVs")
    a = parser.parse_args(argv)
    stale = []
    for doc in map(Path, a.docs):
        text = doc.read_text()
        new = render(text, str(doc))
        if new != text:
            if a.check:
                stale += [f"{doc}: block {m.group(2)} differs from the committed CSVs" for m, n in
                          zip(BLOCK.finditer(text), BLOCK.finditer(new)) if m.group(0) != n.group(0)]
            else:
                doc.write_text(new)
                print(f"rewrote {doc}")
    for line in stale:
        print(line, file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
