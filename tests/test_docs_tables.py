"""docs/tables.md documents every column of every table the analyses return (ol.evaluate) and write (evaluate.py):
each column name a table declares appears in its section, so a new column cannot go undocumented."""

from __future__ import annotations

import re

import pytest

from outlierlab.metrics.layernorm import LAYERNORM_ROW_FIELDS
from outlierlab.evaluation.analyses import ablation, frequent_tokens, isotropy, order_use, outliers, qk_outliers, sts
from tests.conftest import ROOT
from tests.evaluate_fixtures import COLUMNS as WRITTEN

DOC = (ROOT / "docs" / "tables.md").read_text()
SECTIONS = dict(re.findall(r"^## (\S+).*?\n(.*?)(?=^## |\Z)", DOC, re.S | re.M))
SHARED = {"layer", "transform"}  # the conventions at the top
FIT = re.compile(r"^(whiten|standardize|abtt|center)_")  # the fit columns, documented once at the top


def documented(section: str, column: str) -> bool:
    if column in SHARED or FIT.match(column):
        return True
    return column in set(re.findall(r"`([^`]+)`", SECTIONS[section]))


def wic_threshold(column: str) -> bool:
    return bool(re.fullmatch(r"acc_0\.\d", column))


# anisotropy.csv's header depends on anisotropy.rogue_k: the default one is among the written headers below
CASES = [("outliers", outliers.COLUMNS), ("isotropy", isotropy.COLUMNS), ("sts", sts.COLUMNS), ("ablation", ablation.COLUMNS), ("order_use", order_use.COLUMNS),
         ("order_use", order_use.LAYER_COLUMNS), ("frequent_tokens", frequent_tokens.COLUMNS),
         ("frequent_tokens", qk_outliers.COLUMNS), ("outliers", LAYERNORM_ROW_FIELDS),
         ("outliers", ["row", "argmax_dim", "argmin_dim", "sigma_dims"]),
         ("anisotropy", ["dim", "cc", "share"]),
         *((name.removesuffix(".csv"), cols) for name, cols in WRITTEN.items())]


@pytest.mark.parametrize("section,columns", CASES, ids=[f"{s}-{i}" for i, (s, _) in enumerate(CASES)])
def test_every_column_is_documented(section, columns):
    missing = [c for c in columns if not (documented(section, c) or (section == "wic" and wic_threshold(c)))]
    assert not missing, f"docs/tables.md, section {section}: undocumented columns {missing}"


def test_a_new_column_would_be_caught():
    assert not documented("outliers", "a_column_nobody_wrote_down")
