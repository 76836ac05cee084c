"""lab.emergence_tables grid (was scripts/summarize_emergence.py): the scheme x switch grids of
docs/emergence.md come from the table CSV."""

import csv

from lab import emergence_tables as summarize


def test_grid_pivots_runs_named_pos_switch_into_rows_and_columns(tmp_path):
    table = tmp_path / "switches.csv"
    cols = [c for c, _, _ in summarize.GRID_METRICS]
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, ["run", "step", *cols])
        w.writeheader()
        w.writerow({"run": "none_clipped_softmax", "step": 399, **{c: 2.0 for c in cols}, "val_ppl": 512.4})
        w.writerow({"run": "learned_softmax", "step": 399, **{c: 1.0 for c in cols}, "argmax_share_last": 0.534})
    out = tmp_path / "grid.md"
    summarize.main(["grid", "--table", str(table), "--out", str(out)])
    text = out.read_text()
    share = text.split("**argmax share")[1].split("**kurtosis")[0]
    # rows in scheme order (learned before none), columns in switch order, a missing cell is a dash
    assert "| pos | softmax | clipped_softmax |" in share
    assert "| learned | 0.53 | – |" in share and "| none | – | 2.00 |" in share
    assert share.index("| learned |") < share.index("| none |")
    assert "| none | – | 512 |" in text.split("**validation perplexity**")[1]
    assert "step 400" in text
    assert text.startswith("<!-- written by: python -m lab.emergence_tables grid")
