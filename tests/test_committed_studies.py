"""The committed studies: each one the command the docs quote, its outputs compact, and remade by one command."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest

from outlierlab.studies.aggregate import build_parser
from outlierlab.studies import committed as cs
from tests.conftest import ROOT

_COMMAND = re.compile(r"python -m outlierlab\.studies\.aggregate ((?:\\\n|[^\n`#])+)")


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
        assert not {"study.csv", "contrasts.csv"} & {p.name for p in path.iterdir()}, folder
        assert not list(path.glob("*.csv.gz")), folder
        header = (path / "study.md").read_text().splitlines()[0]
        assert header == f"# Study: {', '.join(parse(cs.argv_of(folder)).paths)}", folder


def study_csvs_the_doc_tables_read(monkeypatch) -> set[str]:
    """The folders (under docs/) of every ``study.csv`` that rendering every generated table of the docs reads."""
    from outlierlab.studies import doc_tables

    read, original = [], doc_tables._read
    monkeypatch.setattr(doc_tables, "_read", lambda path: read.append(path) or original(path))
    for page in cs.generated_pages(ROOT / "docs"):
        doc_tables.render(page.read_text(), str(page))
    assert any(path.endswith("/contrasts.csv") for path in read)  # the recording sees the tables' reads
    return {path.removeprefix("docs/").removesuffix("/study.csv") for path in read if path.endswith("/study.csv")}


def test_study_csv_is_committed_exactly_where_a_table_or_a_page_reads_it(monkeypatch):
    """A study.csv.xz nothing reads is a third of the docs' bytes for no claim; one a table or a link reads must be
    there. The registry's declared set is what the readers give."""
    read = study_csvs_the_doc_tables_read(monkeypatch) | cs.linked_study_csvs(ROOT / "docs")
    assert read <= set(cs.STUDIES), f"a study.csv read outside the registry: {sorted(read - set(cs.STUDIES))}"
    assert cs.STUDY_CSV_READ == read, (f"committed.STUDY_CSV_READ is not what the tables and pages read: "
                                       f"missing {sorted(read - cs.STUDY_CSV_READ)}, unread {sorted(cs.STUDY_CSV_READ - read)}")
    committed = {folder for folder in cs.STUDIES if (ROOT / "docs" / folder / "study.csv.xz").is_file()}
    assert committed == read, f"committed but unread {sorted(committed - read)}; read but missing {sorted(read - committed)}"
    assert 0 < len(read) < len(cs.STUDIES)


def test_a_study_without_its_study_csv_names_the_command_that_writes_it():
    for folder in set(cs.STUDIES) - cs.STUDY_CSV_READ:
        md = (ROOT / "docs" / folder / "study.md").read_text()
        assert "All metrics, steps and layers: `study.csv`" not in md, folder
        commands = [argv for _, argv in quoted_commands() if out_folder(argv) == cs.SCRATCH]
        line = md.rstrip("\n").splitlines()[-1]
        argv = shlex.split(_COMMAND.search(line).group(1))
        assert argv in commands and argv[-2:] == ["--out", cs.SCRATCH], folder
        # the registry's command but for the scratch folder it writes into
        assert vars(parse(argv)) | {"out": None} == vars(parse(cs.argv_of(folder))) | {"out": None}, folder
        assert line.startswith("Every test: `contrasts.csv`. All metrics, steps and layers, `study.csv`: not committed")


def test_the_study_csv_line_is_rewritten_once_or_refused():
    md = "# Study: docs/order_use/cells.parquet\n\n| a |\n\nAll metrics, steps and layers: `study.csv` and `contrasts.csv`.\n"
    new = cs.without_study_csv(md, "order_use/study")
    assert new.startswith("# Study: docs/order_use/cells.parquet\n\n| a |\n\nEvery test: `contrasts.csv`. ")
    assert new.endswith(" --primary val/loss@model,val/order_use@model --out /tmp/study` writes it.\n")
    assert "`python -m outlierlab.studies.aggregate docs/order_use/cells.parquet --contrast pos=learned,none " in new
    alone = cs.without_study_csv(md.replace(" and `contrasts.csv`", ""), "order_use/study")
    assert "Every test" not in alone and "`study.csv`: not committed" in alone
    with pytest.raises(ValueError, match="order_use/study/study.md: no line"):
        cs.without_study_csv(new, "order_use/study")


def test_a_study_csv_link_counts_from_its_page_and_from_the_root(tmp_path):
    docs = tmp_path / "docs"
    (docs / "area").mkdir(parents=True)
    (tmp_path / "README.md").write_text("[curves](docs/area/a/study.csv.xz)\n")
    (docs / "area.md").write_text("[b](area/b/study/study.csv) [c](area/c/contrasts.csv.xz) from study.csv.xz\n")
    assert cs.linked_study_csvs(docs) == {"area/a", "area/b/study"}


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
    uncommitted study.csv) and, byte for byte, the CSV text in contrasts.csv.xz."""
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
    # the CSV text itself (another liblzma may pack it otherwise)
    name = "contrasts.csv.xz"
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
