"""The result tables of the docs, generated from committed study outputs instead of transcribed.

A doc marks each generated block::

    <!-- generated: emergence_seeds -->
    ... (replaced) ...
    <!-- end generated -->

and ``python -m lab.doc_tables docs/emergence.md docs/findings.md`` rewrites every block from
``TABLES`` (``--check``: exit 1 naming each block that differs from what the committed CSVs give, as the tests
do).  The tables of the seed studies, the objectives and the loop monitors are here, docs/order_use.md's in
``lab.order_use_doc_tables``, and what they all read and how they write a number in
``lab.doc_table_reads``. Every table reads ``study.csv`` / ``contrasts.csv`` written by ``python -m outlierlab.studies.aggregate`` (committed
compressed, the contrasts' per-step curves only where a page reads them, and each family's full counts in
``families.csv``: ``lab.committed``) and, for per-seed rows, the cells' own CSVs
(``outlierlab.studies.cells.cell_numbers``).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from functools import partial
from pathlib import Path
from typing import Callable

import pandas as pd

from lab import doc_table_reads as reads, order_use_doc_tables
from lab.doc_table_reads import (adjusted, cells_of, contrast_row, families_line, fmt, seeds_word, shown,
                                                signed, summary_cell)
from outlierlab.utils.atomic import write_atomic

SEEDS = "docs/emergence/seeds"
SWITCH = "docs/emergence/switch_seeds"
EVALUATE = "docs/emergence/seeds_evaluate"
OBJECTIVES = "docs/objectives/cells"
#: The same two seed studies with 5 seeds, on one GPU and one code version
SEEDS_GPU = "docs/emergence/seeds_gpu"
SWITCH_GPU = "docs/emergence/switch_seeds_gpu"



BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)

#: The primary quantities of the seed studies, in the order the docs show them.
PRIMARY = [("hidden/argmax_share", "layer_4", "argmax share"), ("hidden/abs_argmax_share", "layer_4", "\\|x\\| argmax share"),
           ("hidden/kurtosis", "layer_4", "kurtosis (1 = flat)"), ("hidden/max_median", "layer_4", "max / median"),
           ("hidden/anisotropy", "layer_4", "anisotropy (1,000 pairs)"), ("val/ppl", "model", "val perplexity")]


def emergence_seeds(study: str = SEEDS) -> str:
    head = ["| quantity | learned | none | learned − none [95% CI] | n | p | adjusted p | MDE (80%) | TOST p (margin) | seeds |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for metric, layer, label in PRIMARY:
        r = contrast_row(study, "pos: learned - none", metric, layer)
        head.append(f"| {label} | {summary_cell(study, 'pos=learned', metric, layer)} | "
                    f"{summary_cell(study, 'pos=none', metric, layer)} | {signed(r['diff'])} [{fmt(r['ci_low'])}, "
                    f"{fmt(r['ci_high'])}] | {int(r['n_pairs'])} | {fmt(r['p_value'], 3)} | {adjusted(r)} | {fmt(r['mde'])} | "
                    f"{fmt(r['tost_p'], 3)} (±{fmt(r['margin'])}) | {seeds_word(r)} |")
    return "\n".join(head + ["", families_line(study, 1000)])


def _cell_table(study: str, group_key: str) -> pd.DataFrame:
    """Every usable cell's numbers, with its ``group_key`` override as ``group`` and its seed."""
    from outlierlab.studies.cells import cell_numbers, find_cells

    return pd.concat([cell_numbers(cell).assign(group=cell.overrides.get(group_key), seed=cell.seed)
                      for cell in find_cells([cells_of(study)]) if cell.usable], ignore_index=True)


def _last(df: pd.DataFrame, metric: str, layer: str) -> pd.Series:
    sub = df[(df["metric"] == metric) & (df["layer"] == layer)]
    return sub[sub["step"] == sub["step"].max()].set_index(["group", "seed"])["value"]


def per_seed(study: str, key: str) -> str:
    """One row per cell of ``study``, its groups told apart by the override ``key``: the last step's numbers."""
    df = _cell_table(study, key)
    cols = [("hidden/argmax_share", "layer_4", "argmax share"), ("hidden/abs_argmax_share", "layer_4", "\\|x\\| argmax share"),
            ("hidden/kurtosis", "layer_4", "kurtosis"), ("hidden/max_median", "layer_4", "max/median"),
            ("hidden/anisotropy", "layer_4", "anisotropy"), ("hidden/inf_norm_ln_input", "max_layer", "inf-norm LN input (max layer)"),
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


def switch_seeds(study: str = SWITCH) -> str:
    lines = ["| quantity | plain (default) | OP | pre-LN | plain − OP [95% CI], p, adjusted p, MDE, TOST p (margin), seeds | "
             "plain − pre-LN [95% CI], p, adjusted p, seeds |", "|---|---|---|---|---|---|"]
    for metric, layer, label in PRIMARY:
        op = contrast_row(study, "arch: default - op", metric, layer)
        pre = contrast_row(study, "arch: default - pre_ln", metric, layer)
        lines.append(f"| {label} | " + " | ".join(summary_cell(study, f"arch={a}", metric, layer) for a in ("default", "op", "pre_ln"))
                     + f" | {signed(op['diff'])} [{fmt(op['ci_low'])}, {fmt(op['ci_high'])}], {fmt(op['p_value'], 3)}, "
                       f"{adjusted(op)}, {fmt(op['mde'])}, {fmt(op['tost_p'], 3)} (±{fmt(op['margin'])}), {seeds_word(op)} | {signed(pre['diff'])} [{fmt(pre['ci_low'])}, "
                       f"{fmt(pre['ci_high'])}], {fmt(pre['p_value'], 3)}, {adjusted(pre)}, {seeds_word(pre)} |")
    return "\n".join(lines + ["", families_line(study, 1000)])


def switch_seeds_all_measures() -> str:
    """Every monitor measure of the last layer, plain vs OP: where the direction holds and where it does not."""
    c = reads.read(f"{SWITCH}/study/contrasts.csv")
    sub = c[(c["contrast"] == "arch: default - op") & (c["layer"] == "layer_4") & c["metric"].str.startswith("hidden/")]
    # a row at the latest step of them all is its own series' last, which every committed contrasts.csv keeps
    sub = sub[sub["step"] == sub["step"].max()].sort_values("metric")
    lines = ["| measure (layer 4, step 2,000) | plain | OP | plain − OP | p | adjusted p | seeds |", "|---|---|---|---|---|---|---|"]
    for _, r in sub.iterrows():
        lines.append(f"| {r['metric'][len('hidden/'):]} | {fmt(r['mean_a'])} | {fmt(r['mean_b'])} | {signed(r['diff'])} | "
                     f"{fmt(r['p_value'], 3)} | {adjusted(r)} | {seeds_word(r)} |")
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
    """The masked-vs-causal study (docs/objectives.md): ``lab.objectives_report`` on its exported cells."""
    from lab import objectives_report

    if not cells_of(OBJECTIVES).exists():
        return f"No cells exported to {OBJECTIVES} yet."
    return objectives_report.report(cells_of(OBJECTIVES), source=shown(cells_of(OBJECTIVES)))[1]


#: The rows of docs/order_use.md's learned-vs-none tables: (metric, layer) at the last step; the rest is in the
#: study's contrasts.csv.
#: One run of examples/sentence_transformers_finetune.py (docs/loop_monitors.md): the monitor's CSV, committed.
MINILM_WIC = "docs/loop_monitors/minilm_wic/hidden_states.csv"


def minilm_wic_finetune() -> str:
    """The sentence-vector order change of every layer of all-MiniLM-L6-v2 and its last layer's anisotropy and
    activation kurtosis, at the first, middle and last record of the contrastive fine-tune."""
    h = reads.read(MINILM_WIC)
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


#: Every generated block, by name: this module's tables and docs/order_use.md's (:mod:`lab.order_use_doc_tables`).
TABLES: dict[str, Callable[[], str]] = {
    **{f.__name__: f for f in (emergence_seeds, switch_seeds, switch_seeds_all_measures, seeds_evaluate, readme_results,
                               objectives, minilm_wic_finetune)},
    "emergence_seeds_per_seed": partial(per_seed, SEEDS, "pos"),
    "switch_seeds_per_seed": partial(per_seed, SWITCH, "arch"),
    "emergence_seeds_gpu": partial(emergence_seeds, SEEDS_GPU),
    "switch_seeds_gpu": partial(switch_seeds, SWITCH_GPU),
    **order_use_doc_tables.TABLES,
}


def render(text: str, source: str = "") -> str:
    def one(m: re.Match) -> str:
        name = m.group(2)
        if name not in TABLES:
            raise ValueError(f"{source}: unknown generated table {name!r} (known: {', '.join(TABLES)})")
        return m.group(1) + TABLES[name]().rstrip("\n") + "\n" + m.group(4)
    return BLOCK.sub(one, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.doc_tables", description=__doc__.split("\n")[0])
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
                write_atomic(doc, new)  # a docs page cut short by a full disk would lose its hand-written rest
                print(f"rewrote {doc}")
    for line in stale:
        print(line, file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
