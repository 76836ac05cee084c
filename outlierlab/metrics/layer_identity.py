"""Which dimension carries each layer's concentration, and since when: one monitor history's answer.

The live monitors write per record and layer the share of tokens whose largest |value| falls on the most common
dimension *and that dimension* (``abs_argmax_share`` rows of ``hidden_states.csv``; likewise
``argmax_share``/``argmin_share``, Luo et al. 2021 §2).  Kovaleva et al. (2021) found BERT's outlier dimensions at the
same index in every layer, early and kept; ``layer_identity`` reads both properties off one history (docs/design.md,
"dimension identity").  Many runs: ``outlierlab.studies.dim_identity``; notebooks: ``ol.dim_identity``.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["layer_identity", "HISTORY"]

#: where a train.py run keeps the history (a loop monitor writes ``<out_dir>/hidden_states.csv``)
HISTORY = "monitor/hidden_states.csv"


def layer_identity(history: pd.DataFrame, statistic: str = "abs_argmax_share") -> pd.DataFrame:
    """Per layer of one run's monitor history (long rows ``step, name, statistic, dim, value``):

    * ``dim``, ``share``: the dimension and its share at the last record (``last_step``);
    * ``held_since``: the first step from which every later record names that dimension (0: since the first record),
      and ``held_fraction`` = 1 − held_since / last step;
    * ``layers_sharing``: how many layers end on the same dimension (Kovaleva's "same index in every layer" is all).

    Indices are arbitrary between runs (hidden units permute): compare identity within a run.  A layer without
    concentration has a share near 1/d and a noise dimension.
    """
    rows = history[(history["statistic"] == statistic) & history["name"].str.fullmatch(r"layer_\d+")]
    if rows.empty:
        raise ValueError(f"no '{statistic}' rows of layers in the history (a monitor history is "
                         f"{HISTORY}, rows 'step,name,statistic,dim,value')")
    if rows["dim"].isna().any():
        raise ValueError(f"'{statistic}' rows without a dimension: this history predates the dim column")
    out = []
    for name, r in rows.sort_values("step").groupby("name", sort=False):
        steps, dims = r["step"].astype(int).tolist(), r["dim"].astype(int).tolist()
        held = len(dims) - 1
        while held > 0 and dims[held - 1] == dims[-1]:
            held -= 1
        out.append({"layer": int(name.split("_")[1]), "last_step": steps[-1], "dim": dims[-1],
                    "share": float(r["value"].iloc[-1]), "held_since": steps[held],
                    "held_fraction": 1 - steps[held] / steps[-1] if steps[-1] else float("nan")})
    table = pd.DataFrame(out).sort_values("layer", ignore_index=True)
    table["layers_sharing"] = table["dim"].map(table["dim"].value_counts())
    return table
