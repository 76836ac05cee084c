"""The committed studies: each one the command the docs quote, its outputs compact, and remade by one command."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest

from outlierlab.studies.aggregate import build_parser
from lab import committed as cs
from tests.conftest import ROOT

_COMMAND = re.compile(r"python -m outlierlab\.studies\.aggregate ((?:\\\n|[^\n`#])+)")
_STUDY_CSV = re.compile(r"[\w./-]+/study\.csv(?:\.xz|\.gz)?")


def linked_study_csvs(docs: Path) -> set[str]:
    """The folders (relative to ``docs``) whose ``study.csv`` (or its .xz / .gz) a page of the docs or the README
    links to: a study the reader is sent to for its curves."""
    return {str(p.parent.relative_to(docs.resolve())) for p in cs.linked(_STUDY_CSV, docs)}


def quoted_commands() -> list[tuple[str, list[str]]]:
    """(page, aggregator arguments) of every ``python -m outlierlab.studies.aggregate`` command a page of the docs quotes
    with a committed table as input (continuation lines joined, a trailing comment dropped)."""
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for match in _COMMAND.finditer(page.read_text()):
            argv = shlex.split(match.group(1).replace("\\\n", " "))
            if argv and argv[0].startswith("docs/") and argv[0].split("/")[0] == "docs":
                found.append((str(page.relative_to(ROOT)), argv))
    return found


def parse(argv: list[str]):
    return build_parser().parse_args(argv)


def out_folder(argv: list[str]) -> str:
    out = argv[argv.index("--out") + 1] if "--out" in argv else argv[0].removesuffix(".parquet") + "/study"
    return out.removeprefix("docs/")


def test_every_quoted_study_command_is_its_registry_entry():
    quoted = [(page, argv) for page, argv in quoted_commands() if out_folder(argv) != "/tmp/study"]
    assert len(quoted) >= 12
    for page, argv in quoted:
        folder = out_folder(argv)
        assert folder in cs.STUDIES, f"{page}: a study writing docs/{folder} is not in committed_studies.STUDIES"
        full = argv if "--out" in argv else [*argv, "--out", f"docs/{folder}"]
        # as the aggregator reads them: the order of the options does not matter, their values do
        assert vars(parse(full)) == vars(parse(cs.argv_of(folder))), \
            f"{page}: the quoted command of {folder} differs from its registry entry"


def test_every_registry_entry_is_committed_compact():
    for folder in cs.STUDIES:
        path = ROOT / "docs" / folder
        assert (path / "study.md").is_file(), folder
        # every test a study made is committed: its study.md names contrasts.csv exactly where the aggregator wrote one
        assert (path / "contrasts.csv.xz").is_file() == ("`contrasts.csv`" in (path / "study.md").read_text()), folder
        assert (path / "families.csv.xz").is_file() == (path / "contrasts.csv.xz").is_file(), folder
        assert not {"study.csv", "contrasts.csv"} & {p.name for p in path.iterdir()}, folder
        assert not list(path.glob("*.csv.gz")), folder
        header = (path / "study.md").read_text().splitlines()[0]
        assert header == f"# Study: {', '.join(parse(cs.argv_of(folder)).paths)}", folder


def study_csvs_the_doc_tables_read(monkeypatch) -> set[str]:
    """The folders (under docs/) of every ``study.csv`` that rendering every generated table of the docs reads."""
    from lab import doc_table_reads, doc_tables

    read, original = [], doc_table_reads.read
    monkeypatch.setattr(doc_table_reads, "read", lambda path: read.append(path) or original(path))
    for page in cs.generated_pages(ROOT / "docs"):
        doc_tables.render(page.read_text(), str(page))
    assert any(path.endswith("/contrasts.csv") for path in read)  # the recording sees the tables' reads
    return {path.removeprefix("docs/").removesuffix("/study.csv") for path in read if path.endswith("/study.csv")}


@pytest.mark.slow
def test_study_csv_is_committed_exactly_where_a_table_or_a_page_reads_it(monkeypatch):
    """A study.csv.xz nothing reads is a third of the docs' bytes for no claim; one a table or a link reads must be
    there. The registry's declared set is what the readers give."""
    read = study_csvs_the_doc_tables_read(monkeypatch) | linked_study_csvs(ROOT / "docs")
    assert read <= set(cs.STUDIES), f"a study.csv read outside the registry: {sorted(read - set(cs.STUDIES))}"
    assert cs.STUDY_CSV_READ == read, (f"committed.STUDY_CSV_READ is not what the tables and pages read: "
                                       f"missing {sorted(read - cs.STUDY_CSV_READ)}, unread {sorted(cs.STUDY_CSV_READ - read)}")
    committed = {folder for folder in cs.STUDIES if (ROOT / "docs" / folder / "study.csv.xz").is_file()}
    assert committed == read, f"committed but unread {sorted(committed - read)}; read but missing {sorted(read - committed)}"
    assert 0 < len(read) < len(cs.STUDIES)


def test_a_study_md_names_what_is_committed_and_the_command_that_writes_the_full_tables():
    commands = [argv for _, argv in quoted_commands() if out_folder(argv) == cs.SCRATCH]
    for folder in cs.STUDIES:
        path = ROOT / "docs" / folder
        md = (path / "study.md").read_text()
        line = md.rstrip("\n").splitlines()[-1]
        assert "All metrics, steps and layers: `study.csv` and `contrasts.csv`." not in md, folder
        assert line.startswith("All metrics, steps and layers: `study.csv`." if folder in cs.STUDY_CSV_READ else
                               "All metrics, steps and layers, `study.csv`: not committed (no page reads it)."), folder
        if (path / "contrasts.csv.xz").is_file():
            kept, total = pd.read_csv(path / "contrasts.csv.xz"), pd.read_csv(path / "families.csv.xz")["rows"].sum()
            assert f"Tests: `contrasts.csv`, {len(kept):,} of its {total:,} rows: " in line, folder
        elif folder in cs.STUDY_CSV_READ:
            assert not _COMMAND.search(line), folder  # everything the aggregator wrote is committed
            continue
        argv = shlex.split(_COMMAND.search(line).group(1))
        assert argv in commands and argv[-2:] == ["--out", cs.SCRATCH], folder
        # the registry's command but for the scratch folder it writes into
        assert vars(parse(argv)) | {"out": None} == vars(parse(cs.argv_of(folder))) | {"out": None}, folder


def test_the_last_line_is_rewritten_once_or_refused():
    md = "# Study: docs/order_use/cells.parquet\n\n| a |\n\nAll metrics, steps and layers: `study.csv` and `contrasts.csv`.\n"
    new = cs.committed_md(md, "order_use/study", 811, 5170)
    assert new.startswith("# Study: docs/order_use/cells.parquet\n\n| a |\n\nAll metrics, steps and layers, `study.csv`: "
                          "not committed (no page reads it). Tests: `contrasts.csv`, 811 of its 5,170 rows: all but the "
                          "per-step curves of the exploratory and not tested families, kept at the last step of each ")
    assert new.endswith(" --primary val/loss@model,val/order_use@model --out /tmp/study` writes the full tables.\n")
    assert "`python -m outlierlab.studies.aggregate docs/order_use/cells.parquet --contrast pos=learned,none " in new
    alone = cs.committed_md(md.replace(" and `contrasts.csv`", ""), "order_use/study")
    assert "Tests" not in alone and alone.endswith("`study.csv`: not committed (no page reads it). `python -m "
                                                   "outlierlab.studies.aggregate docs/order_use/cells.parquet "
                                                   "--contrast pos=learned,none --primary val/loss@model,"
                                                   "val/order_use@model --out /tmp/study` writes it.\n")
    read = cs.committed_md(md.replace(" and `contrasts.csv`", ""), "emergence/seeds/study")
    assert read.endswith("\n\nAll metrics, steps and layers: `study.csv`.\n")  # all of it committed: no command
    with pytest.raises(ValueError, match="order_use/study/study.md: no line"):
        cs.committed_md(new, "order_use/study", 811, 5170)
    with pytest.raises(ValueError, match="rows of contrasts.csv are needed"):
        cs.committed_md(md, "order_use/study")


def _contrasts(rows: list[tuple]) -> pd.DataFrame:
    """A contrasts table of (contrast, metric, step, family, p_value, p_holm, q_bh) rows, one group pair per contrast."""
    frame = pd.DataFrame(rows, columns=["contrast", "metric", "step", "family", "p_value", "p_holm", "q_bh"])
    pair = frame["contrast"].str.extract(r"pos: (\w+) - (\w+)")
    return frame.assign(group_a="pos=" + pair[0], group_b="pos=" + pair[1], layer="model")


def test_the_committed_rows_are_the_tests_and_the_curves_last_and_read_steps():
    nan = float("nan")
    full = _contrasts([
        ("pos: learned - none", "hidden/kurtosis", 0, "not tested", nan, nan, nan),       # 0: a curve, dropped
        ("pos: learned - none", "hidden/kurtosis", 100, "exploratory", 0.01, nan, 0.2),   # 1: a curve, dropped
        ("pos: learned - none", "hidden/kurtosis", 200, "primary", 0.02, 0.04, 0.04),     # 2: a test
        ("pos: learned - none", "hidden/anisotropy", 100, "exploratory", 0.3, nan, 0.5),  # 3: dropped
        ("pos: learned - none", "hidden/anisotropy", 200, "exploratory", 0.4, nan, 0.6),  # 4: its last step
        ("pos: rope - none", "hidden/anisotropy", 100, "exploratory", 0.3, nan, 0.5),     # 5: another pair's last step
        ("pos: learned - none", "val/loss", 100, "exploratory performance", 0.01, nan, 0.03),  # 6: every row
        ("pos: learned - none", "val/loss", 200, "performance", 0.01, 0.02, 0.02),        # 7
        ("pos: learned - none", "hidden/max_median", 100, "duplicate", nan, nan, nan),    # 8: in no family, kept
        ("pos: learned - none", "val/order_use", 0, "not tested", nan, nan, nan),         # 9: a series read whole
        ("pos: learned - none", "val/order_use", 100, "exploratory", 0.5, nan, 0.7),      # 10
        ("pos: learned - none", "val/order_use", 200, "exploratory", 0.5, nan, 0.7),      # 11
        ("pos: learned - none", "hidden/argmax_share", 0, "exploratory", 0.01, nan, 0.2),  # 12: a step a page quotes
        ("pos: learned - none", "hidden/argmax_share", 100, "exploratory", 0.5, nan, 0.7),  # 13
    ])
    assert cs.committed_contrasts(full, "order_use/study").index.tolist() == [2, 4, 5, 6, 7, 8, 11, 13]
    assert cs.committed_contrasts(full, "order_use/study_schemes").index.tolist() == [2, 4, 5, 6, 7, 8, 9, 10, 11, 13]
    assert cs.committed_contrasts(full, "emergence/seeds/study").index.tolist() == [2, 4, 5, 6, 7, 8, 11, 12, 13]
    # the kept rows are the full table's, corrections untouched
    kept = cs.committed_contrasts(full, "order_use/study")
    pd.testing.assert_frame_equal(kept, full.loc[kept.index])


def test_family_counts_are_the_full_tables_per_step():
    nan = float("nan")
    full = _contrasts([
        ("pos: learned - none", "hidden/kurtosis", 100, "exploratory", 0.01, nan, 0.2),
        ("pos: learned - none", "hidden/anisotropy", 100, "exploratory", 0.04, nan, 0.049),
        ("pos: learned - none", "hidden/anisotropy", 200, "exploratory", 0.06, nan, 0.06),
        ("pos: learned - none", "hidden/kurtosis", 200, "primary", 0.001, 0.002, 0.002),
        ("pos: learned - none", "hidden/kurtosis", 0, "not tested", nan, nan, nan),
    ])
    counts = cs.family_counts(full)
    assert counts.columns.tolist() == ["family", "step", "rows", "p_holm_below_05", "q_bh_below_05", "p_below_05"]
    assert counts.values.tolist() == [["exploratory", 100, 2, 0, 1, 2], ["exploratory", 200, 1, 0, 0, 0],
                                      ["not tested", 0, 1, 0, 0, 0], ["primary", 200, 1, 1, 1, 1]]


def _committed(folder: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    path = ROOT / "docs" / folder
    return pd.read_csv(path / "contrasts.csv.xz"), pd.read_csv(path / "families.csv.xz")


def with_contrasts() -> list[str]:
    return [f for f in cs.STUDIES if (ROOT / "docs" / f / "contrasts.csv.xz").is_file()]


def contrast_reads(monkeypatch) -> list[tuple]:
    """(folder under docs/, contrast, metric, layer, step asked, step read) of every contrasts row that rendering every
    generated table of the docs reads through :func:`doc_table_reads.contrast_at`."""
    from lab import doc_table_reads, doc_tables

    reads, original = [], doc_table_reads.contrast_at

    def recording(folder, contrast, metric, layer, step=None):
        row = original(folder, contrast, metric, layer, step)
        reads.append((folder.removeprefix("docs/"), contrast, metric, layer, step, None if row is None else row["step"]))
        return row

    monkeypatch.setattr(doc_table_reads, "contrast_at", recording)
    for page in cs.generated_pages(ROOT / "docs"):
        doc_tables.render(page.read_text(), str(page))
    return reads


#: The curve rows a page's prose quotes before their series' last step (checked against the page below).
QUOTED = {"emergence/seeds/study": frozenset({("hidden/argmax_share", None, 0)})}


@pytest.mark.slow
def test_the_rows_read_before_their_last_step_are_the_declared_ones(monkeypatch):
    """Derived from the readers: a table that reads a curve at an earlier step needs that series committed whole; a
    declared series no table reads that way is bytes for nothing."""
    reads = contrast_reads(monkeypatch)
    assert len(reads) > 100 and any(step is not None for *_, step, _ in reads)  # the recording sees the tables' reads
    earlier: dict[str, set] = {}
    for folder, contrast, metric, layer, step, read in reads:
        assert folder in cs.STUDIES, f"a contrasts.csv read outside the registry: docs/{folder}"
        c, _ = _committed(folder)
        series = c[(c["metric"] == metric) & (c["layer"] == layer) & ((c["contrast"] == contrast) if contrast else True)]
        assert step is None or read == step, f"docs/{folder}: no {contrast} {metric}@{layer} row at step {step}"
        if step is not None and step < series["step"].max():
            earlier.setdefault(folder, set()).add((metric, layer, None))  # the tables read a series at every step
    declared = {f: frozenset(earlier.get(f, set()) | QUOTED.get(f, set())) for f in {*earlier, *QUOTED}}
    assert declared == cs.CONTRASTS_READ


def test_the_quoted_step_0_rows_are_committed_and_say_what_the_page_says():
    """docs/emergence.md: at step 0 the argmax share's learned - none raw p is 0.005 at the last layer, q 0.26, and
    q 0.17-0.26 at every layer (exploratory rows before the last step, committed for this quote)."""
    c, _ = _committed("emergence/seeds/study")
    rows = c[(c["metric"] == "hidden/argmax_share") & (c["step"] == 0)].set_index("layer")
    assert set(rows.index) == {"layer_0", "layer_1", "layer_2", "layer_3", "layer_4", "max_layer"}
    quoted = (f"raw paired p = {rows.at['layer_4', 'p_value']:.3f} at the last layer, but BH q = "
              f"{rows.at['layer_4', 'q_bh']:.2f} among the study's 2,496 exploratory contrasts\n"
              f"({rows['q_bh'].min():.2f}-{rows['q_bh'].max():.2f} at every layer)")
    assert quoted in (ROOT / "docs/emergence.md").read_text()


@pytest.mark.parametrize("folder", with_contrasts())
def test_a_committed_contrasts_file_holds_exactly_the_rule_s_rows(folder):
    """No curve row the rule drops (nothing reads it), every row of the kept families (their counts are the full
    table's), and a series a table reads at earlier steps at more than its last."""
    c, families = _committed(folder)
    assert len(cs.committed_contrasts(c, folder)) == len(c), f"docs/{folder}: keeps curve rows nothing reads"
    whole = families[~families["family"].isin(cs.CURVE_FAMILIES)]
    from_rows = cs.family_counts(c)
    pd.testing.assert_frame_equal(from_rows[~from_rows["family"].isin(cs.CURVE_FAMILIES)].reset_index(drop=True),
                                  whole.reset_index(drop=True), check_dtype=False)
    curves = families.groupby("family")["rows"].sum()
    for family in cs.CURVE_FAMILIES:
        assert (c["family"] == family).sum() <= curves.get(family, 0), (folder, family)
    for metric, layer, step in cs.CONTRASTS_READ.get(folder, ()):  # the rows the tables read: see the test above
        rows = c[(c["metric"] == metric) & ((c["layer"] == layer) if layer else True)]
        assert rows["step"].nunique() > 1 if step is None else (rows["step"] == step).any(), folder


_FAMILY = re.compile(r"^\* \*\*(primary|performance|exploratory performance|exploratory)\b[^:]*: (\d+) tests?\*\*(.*)$", re.M)
_UNTESTED = re.compile(r"^\* not tested: (\d+) .*; duplicate: (\d+) ", re.M)


@pytest.mark.parametrize("folder", with_contrasts())
def test_family_counts_are_those_the_aggregator_stated_of_the_full_table(folder):
    """study.md states each family's size and rejections, computed by the aggregator on the full table: families.csv
    (and so the Families lines of the pages) must give the same."""
    _, families = _committed(folder)
    total = families.groupby("family")[["rows", "p_holm_below_05", "q_bh_below_05"]].sum()
    md = (ROOT / "docs" / folder / "study.md").read_text()
    stated = _FAMILY.findall(md)
    assert {"primary", "exploratory"} <= {family for family, *_ in stated}, folder
    for family, n, rest in stated:
        assert (total.loc[family, "rows"] if family in total.index else 0) == int(n), (folder, family)
        below = re.search(r"(\d+)(?: with Holm p)? below 0\.05", rest)
        if int(n):
            column = "p_holm_below_05" if family in ("primary", "performance") else "q_bh_below_05"
            assert total.loc[family, column] == int(below.group(1)), (folder, family)
    untested, duplicate = map(int, _UNTESTED.search(md).groups())
    assert (total["rows"].get("not tested", 0), total["rows"].get("duplicate", 0)) == (untested, duplicate), folder


@pytest.mark.slow
def test_a_page_s_families_line_counts_the_full_table(tmp_path, monkeypatch):
    """The Families line of docs/emergence.md (from families.csv) against the rows of a fresh full contrasts.csv,
    counted here row by row."""
    from outlierlab.studies import aggregate
    from lab import doc_table_reads, doc_tables

    monkeypatch.chdir(ROOT)
    argv = cs.argv_of("emergence/seeds/study")
    i = argv.index("--out")
    assert aggregate.main([*argv[:i], "--no-plots", "--out", str(tmp_path), *argv[i + 2:]]) == 0
    c = pd.read_csv(tmp_path / "contrasts.csv")
    assert len(c) > len(pd.read_csv(ROOT / "docs/emergence/seeds/study/contrasts.csv.xz"))  # the committed one is part

    def family(name: str) -> pd.DataFrame:
        return c[c["family"] == name]

    parts = [f"{f} {len(family(f))} test{'' if len(family(f)) == 1 else 's'}, "
             f"{(family(f)['p_holm'] < 0.05).sum()} with Holm p < 0.05" for f in ("primary", "performance")]
    for f in ("exploratory", "exploratory performance"):
        rows, late = family(f), family(f)[family(f)["step"] >= 1000]
        parts.append(f"{f} {len(rows)}, {(rows['q_bh'] < 0.05).sum()} with BH q < 0.05 within it ({len(late)} from step "
                     f"1,000 on, {(late['q_bh'] < 0.05).sum()} with q < 0.05; raw p < 0.05: {(late['p_value'] < 0.05).sum()})")
    expected = (f"Families (docs/emergence/seeds/study/families.csv.xz, the full contrasts table), each corrected "
                f"within itself: " + "; ".join(parts) + f"; not tested (constant or one seed) {len(family('not tested'))}, "
                f"post-hoc duplicates of a monitor row {len(family('duplicate'))}.")
    assert doc_table_reads.families_line(doc_tables.SEEDS, 1000) == expected
    assert expected in (ROOT / "docs/emergence.md").read_text()


def test_a_study_csv_link_counts_from_its_page_and_from_the_root(tmp_path):
    docs = tmp_path / "docs"
    (docs / "area").mkdir(parents=True)
    (tmp_path / "README.md").write_text("[curves](docs/area/a/study.csv.xz)\n")
    (docs / "area.md").write_text("[b](area/b/study/study.csv) [c](area/c/contrasts.csv.xz) from study.csv.xz\n")
    assert linked_study_csvs(docs) == {"area/a", "area/b/study"}


def test_a_large_plain_csv_under_docs_is_one_a_plain_csv_reader_needs():
    """Over 50 KB, a CSV that pandas alone reads is committed as .csv.xz (a fifth of the bytes or less); the loop
    monitor's hidden_states.csv stays plain because ol.dim_identity and the history readers take a monitor folder's
    own file."""
    large = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.csv") if p.stat().st_size > 50_000}
    assert large == {"docs/loop_monitors/minilm_wic/hidden_states.csv"}


def test_every_committed_figure_is_shown_by_a_page():
    """Figures nobody links are the aggregator's to redraw, not the checkout's to carry."""
    shown = cs.shown_figures(ROOT / "docs")
    orphans = [str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.png") if p.resolve() not in shown]
    assert orphans == []


def test_a_figure_link_counts_from_its_page_and_from_the_root(tmp_path):
    docs = tmp_path / "docs"
    (docs / "area" / "curves").mkdir(parents=True)
    (tmp_path / "README.md").write_text("![a](docs/area/curves/a.png)\n")
    (docs / "area.md").write_text("![b](area/curves/b.png) and outside ![c](../c.png)\n")
    assert cs.shown_figures(docs) == {(docs / "area/curves/a.png").resolve(), (docs / "area/curves/b.png").resolve()}


def test_an_unknown_study_is_one_line(capsys):
    assert cs.main(["order_use/nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "order_use/nope" in err and "order_use/study_large" in err


@pytest.mark.slow
def test_one_command_remakes_a_committed_study_byte_for_byte(tmp_path):
    """The cells table and the registry's command give the committed study.md (which names the command for the
    full tables) and, byte for byte, the CSV text in contrasts.csv.xz (the rule's rows) and families.csv.xz."""
    folder = "order_use/study"
    (tmp_path / "docs" / "order_use").mkdir(parents=True)
    shutil.copy2(ROOT / "docs/order_use/cells.parquet", tmp_path / "docs/order_use/cells.parquet")
    shutil.copy2(ROOT / "docs/order_use.md", tmp_path / "docs/order_use.md")
    (tmp_path / "README.md").write_text("")
    made = cs.regenerate(folder, root=tmp_path)
    committed = ROOT / "docs" / folder
    import lzma

    assert (made / "study.md").read_bytes() == (committed / "study.md").read_bytes()
    assert folder not in cs.STUDY_CSV_READ and not (made / "study.csv.xz").exists()  # no page reads its curves
    # the CSV text itself (another liblzma may pack it otherwise): the fresh run's rows under the committed rule
    # and its family counts
    for name in ("contrasts.csv.xz", "families.csv.xz"):
        assert lzma.decompress((made / name).read_bytes()) == lzma.decompress((committed / name).read_bytes()), name
    assert sorted(p.name for p in (made / "curves").glob("*.png")) == \
        sorted(p.name for p in (committed / "curves").glob("*.png"))
    contrasts = pd.read_csv(made / "contrasts.csv.xz")
    assert {"family", "p_holm", "q_bh"} <= set(contrasts.columns)


def test_the_float_format_keeps_six_significant_digits(tmp_path):
    path = tmp_path / "t.csv.xz"
    cs.write_xz(pd.DataFrame({"x": [0.123456789, 1234567.0, 5.61e-07]}), path)
    assert pd.read_csv(path)["x"].tolist() == [0.123457, 1234570.0, 5.61e-07]
    first = path.read_bytes()
    cs.write_xz(pd.DataFrame({"x": [0.123456789, 1234567.0, 5.61e-07]}), path)
    assert path.read_bytes() == first  # no timestamp: a rerun commits nothing new
