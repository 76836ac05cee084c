"""A study's declared design and what it licenses: the primary family, corrected p-values, power and equivalence.

The design is declared beside the sweep, in the experiment config (``configs/experiment/<name>.yaml``)::

    study_design:
      contrasts: ["pos=learned,none"]                         # run when no --contrast is given
      primary_contrasts: ["pos=learned,none"]                 # the primary family's contrasts (default: all)
      primary: [hidden/argmax_share@layer_4, val/ppl@model]   # metric@layer, at the last step every cell reached
      equivalence_margin: {hidden/argmax_share: 0.1}          # in the metric's own units (TOST)

or on the command line (``--primary``, ``--equivalence-margin``), which wins; then the cells' resolved config, then
``configs/experiment/<experiment>.yaml``.  Every contrast row gets a ``family`` (docs/studies.md) and corrections stay
within it: ``primary`` (the declared outlier metric@layer at the last step all cells of both groups reached, in the
primary contrasts; nothing declared: ``DEFAULT_PRIMARY``; Holm ``p_holm`` and BH ``q_bh``), ``performance`` (the
declared ``PERFORMANCE`` metrics at that step; Holm and BH, never pooled with outlier measures), ``exploratory`` and
``exploratory performance`` (every other row; BH), and in no family ``not tested`` (p NaN) and ``duplicate`` (a
post-hoc row the live monitor recorded too).  Confirmatory rows also get the 80 %-power minimum detectable effect
(``mde``) and, with a margin, the TOST p (``tost_p``): ``outlierlab.studies.study_inference``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import yaml

# The family names and rules are pure definitions, kept with the statistics so that reports (below jobs) share them.
from outlierlab.studies.study_inference import (CONFIRMATORY, DUPLICATE, EXPLORATORY, EXPLORATORY_PERFORMANCE,
                                                NOT_TESTED, adjust_pvalues, family_rules, is_performance,
                                                minimum_detectable_effect, tost)
from outlierlab.configuration.overrides import CONFIG_DIR
from outlierlab.studies.cells import current_name

CONFIGS = CONFIG_DIR / "experiment"
DESIGN_KEY = "study_design"


def parse_primary(items: Sequence[str]) -> list[tuple[str, str]]:
    """``["hidden/kurtosis@layer_4"]`` -> ``[("hidden/kurtosis", "layer_4")]`` (layer ``model`` when omitted)."""
    out = []
    for item in items:
        metric, _, layer = str(item).partition("@")
        if not metric:
            raise ValueError(f"primary metric {item!r}: write metric@layer, e.g. hidden/argmax_share@layer_4")
        out.append((current_name(metric), layer or "model"))
    return out


def parse_margins(spec: Any) -> dict[str, float] | float | None:
    """A number (every primary metric), a mapping metric -> margin, or ``"m=0.1,n=2"`` from the command line."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, Mapping):
        return {current_name(str(k)): float(v) for k, v in spec.items()}
    if isinstance(spec, (int, float)):
        return float(spec)
    text = str(spec)
    if "=" not in text:
        return float(text)
    out = {}
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        try:
            out[current_name(k)] = float(v)
        except ValueError:
            raise ValueError(f"--equivalence-margin {spec!r}: write metric=margin[,metric=margin] or one number") from None
    return out


def _from_config_file(name: str) -> dict:
    path = CONFIGS / f"{name}.yaml"
    if not path.is_file():
        return {}
    try:
        return (yaml.safe_load(path.read_text()) or {}).get(DESIGN_KEY) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: cannot read its {DESIGN_KEY} ({' '.join(str(e).split())[:120]})") from None


def declared_design(cells: Sequence, primary: Sequence[str] | None = None, margin: Any = None) -> dict:
    """``{"primary": [(metric, layer)], "margin": ..., "source": where it came from}``."""
    design, source = {}, "none declared"
    from_cells = [{k[len(DESIGN_KEY) + 1:]: v for k, v in c.config.items() if k.startswith(DESIGN_KEY + ".")}
                  for c in cells]
    from_cells = [d for d in from_cells if d]
    if from_cells:
        design = {"primary": from_cells[0].get("primary"), "contrasts": from_cells[0].get("contrasts"),
                  "primary_contrasts": from_cells[0].get("primary_contrasts"),
                  "equivalence_margin": {k.split(".", 1)[1]: v for k, v in from_cells[0].items()
                                         if k.startswith("equivalence_margin.")} or from_cells[0].get("equivalence_margin")}
        source = "the cells' resolved config"
    else:
        names = sorted({c.overrides.get("experiment") for c in cells} - {None})
        if len(names) == 1 and _from_config_file(names[0]):
            design, source = _from_config_file(names[0]), f"configs/experiment/{names[0]}.yaml"
    if primary:
        design = {**design, "primary": list(primary)}
        source = "--primary"
    if margin is not None:
        design = {**design, "equivalence_margin": margin}
    contrasts = [str(c) for c in design.get("contrasts") or []]
    return {"primary": parse_primary(design.get("primary") or []), "contrasts": contrasts,
            "primary_contrasts": [str(c) for c in design.get("primary_contrasts") or contrasts],
            "margin": parse_margins(design.get("equivalence_margin")), "source": source}


def contrast_name(spec: str) -> str:
    """``arch=default,op`` -> ``arch: default - op`` (the ``contrast`` column of contrasts.csv)."""
    key, _, values = spec.partition("=")
    a, _, b = values.partition(",")
    return f"{key}: {a} - {b}"


def _margin_for(margin: dict[str, float] | float | None, metric: str) -> float:
    if margin is None:
        return math.nan
    if isinstance(margin, float):
        return margin
    return float(margin.get(metric, math.nan))


@functools.lru_cache(maxsize=None)
def _standardized_mde(n_a: int, n_b: int, paired: bool) -> float:
    return minimum_detectable_effect(n_a, n_b, 1.0, paired)


def last_reached(per_seed: pd.DataFrame) -> dict[str, int]:
    """Per group, the last step every one of its cells reached (the smallest of the cells' last recorded steps)."""
    if per_seed.empty:
        return {}
    ends = per_seed[per_seed["step"] >= 0].groupby(["group", "seed"], dropna=False)["step"].max()
    return {str(g): int(v) for g, v in ends.groupby(level="group").min().items()}


def assign_families(table: pd.DataFrame, per_seed: pd.DataFrame, design: dict) -> pd.DataFrame:
    """Add ``family, p_holm, q_bh, mde, margin, tost_p`` to a contrast table (see the module docstring)."""
    cols = dict(family=[], p_holm=[], q_bh=[], mde=[], margin=[], tost_p=[])
    if table.empty:
        return table.assign(**cols)
    t = table.copy()
    perf = t["metric"].map(is_performance)
    t["family"] = np.where(perf, EXPLORATORY_PERFORMANCE, EXPLORATORY)
    testable = np.isfinite(t["p_value"].astype(float))
    t.loc[~testable, "family"] = NOT_TESTED
    hidden = set(zip(t["group_a"], t["group_b"], t["step"], t["layer"], t["metric"]))
    is_dup = np.array([m.startswith("posthoc/") and (ga, gb, s, l, "hidden/" + m[len("posthoc/"):]) in hidden
                       for ga, gb, s, l, m in zip(t["group_a"], t["group_b"], t["step"], t["layer"], t["metric"])],
                      dtype=bool)
    t.loc[is_dup & testable, "family"] = DUPLICATE
    # the last step every cell of both groups reached; per metric and layer, its last row at or before that step
    reached = last_reached(per_seed)
    # validations and monitors are at the same steps (the model's: outlierlab.studies.cells), so a cell whose last
    # rows are validations (no monitor files) reached the others' last monitor row
    end = [min(reached.get(ga, s), reached.get(gb, s)) for ga, gb, s in zip(t["group_a"], t["group_b"], t["step"])]
    upto = t[t["step"].to_numpy() <= np.array(end)]
    final = upto.groupby(["contrast", "group_a", "group_b", "metric", "layer"])["step"].transform("max")
    at_end = pd.Series(False, index=t.index)
    at_end.loc[upto.index] = upto["step"].to_numpy() == final.to_numpy()
    declared = {contrast_name(c) for c in design.get("primary_contrasts") or []}
    in_primary_contrast = t["contrast"].isin(declared) if declared else pd.Series(True, index=t.index)
    rules = family_rules(design, set(zip(t["metric"], t["layer"])))
    candidates = at_end & in_primary_contrast & t["family"].isin([EXPLORATORY, EXPLORATORY_PERFORMANCE])
    for family in CONFIRMATORY:
        wanted = set(rules[family])
        sel = candidates & pd.Series([(m, l) in wanted for m, l in zip(t["metric"], t["layer"])], index=t.index)
        t.loc[sel, "family"] = family
    t["p_holm"] = math.nan
    t["q_bh"] = math.nan
    for family in (*CONFIRMATORY, EXPLORATORY, EXPLORATORY_PERFORMANCE):
        sel = t["family"] == family
        if family in CONFIRMATORY:
            t.loc[sel, "p_holm"] = adjust_pvalues(t.loc[sel, "p_value"], "holm")
        t.loc[sel, "q_bh"] = adjust_pvalues(t.loc[sel, "p_value"], "fdr_bh")
    t["mde"], t["margin"], t["tost_p"] = math.nan, math.nan, math.nan
    for i in t.index[t["family"].isin(CONFIRMATORY)]:
        r = t.loc[i]
        paired = r["test"] == "paired t"
        n_a, n_b = (int(r["n_pairs"]), int(r["n_pairs"])) if paired else (int(r["n_a"]), int(r["n_b"]))
        t.at[i, "mde"] = _standardized_mde(n_a, n_b, paired) * float(r["sd"]) if min(n_a, n_b) >= 2 else math.nan
        m = _margin_for(design["margin"], r["metric"])
        t.at[i, "margin"] = m
        if math.isfinite(m):
            a, b = _values(per_seed, r["group_a"], r), _values(per_seed, r["group_b"], r)
            if paired:
                shared = sorted(set(a) & set(b))
                t.at[i, "tost_p"] = tost([a[s] for s in shared], [b[s] for s in shared], m, True)
            else:
                t.at[i, "tost_p"] = tost(list(a.values()), list(b.values()), m, False)
    return t


def _values(per_seed: pd.DataFrame, group: str, r: pd.Series) -> dict:
    sub = per_seed[(per_seed["group"] == group) & (per_seed["step"] == r["step"]) & (per_seed["layer"] == r["layer"])
                   & (per_seed["metric"] == r["metric"])]
    return {int(s): float(v) for s, v in zip(sub["seed"], sub["value"]) if math.isfinite(float(v))}
