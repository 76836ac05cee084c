"""The result tables of docs/emergence.md, docs/findings.md and docs/order_use.md are generated from the study CSVs
(lab.doc_tables), replacing the hand-transcribed tables of scripts/summarize_emergence.py's era."""

from __future__ import annotations

import pytest

from lab import doc_tables
from tests.conftest import ROOT


@pytest.mark.parametrize("doc", ["docs/emergence.md", "docs/findings.md", "docs/order_use.md", "docs/loop_monitors.md",
                                 "docs/objectives.md"])
@pytest.mark.slow
def test_every_generated_block_equals_what_the_committed_csvs_give(doc, capsys):
    text = (ROOT / doc).read_text()
    assert "<!-- generated: " in text
    assert doc_tables.main(["--check", str(ROOT / doc)]) == 0, capsys.readouterr().err


def test_a_hand_edited_number_is_named(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    good = doc_tables.render("<!-- generated: emergence_seeds -->\n<!-- end generated -->\n")
    assert "| argmax share | 0.40 [0.01, 0.97] | 0.27 [0.05, 0.69] | +0.14 [−0.99, 1.00] | 3 |" in good  # a difference of two shares: its interval clipped at 1
    doc.write_text(good.replace("0.40 [0.01, 0.97]", "0.40 ± 0.83"))
    assert doc_tables.main(["--check", str(doc)]) == 1
    assert "block emergence_seeds differs from the committed CSVs" in capsys.readouterr().err
    assert doc_tables.main([str(doc)]) == 0 and doc.read_text() == good


def test_the_table_values_are_the_study_rows():
    """The per-seed table reads the cells themselves: learned seed 1 is the run that grew a dominant dim."""
    table = doc_tables.TABLES["emergence_seeds_per_seed"]()
    assert "| learned | 1 | 0.79 |" in table and "| none | 2 | 0.42 |" in table


def test_unknown_block_is_one_line():
    with pytest.raises(ValueError, match="unknown generated table 'nope'"):
        doc_tables.render("<!-- generated: nope -->\nx\n<!-- end generated -->", "x.md")
