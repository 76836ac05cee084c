"""A table the docs print right below a table command (``python -m outlierlab.studies.ablation_table ...``,
``...position_profile ...``) on committed data is that command's output, row for row: a number changed by hand, a row
pasted twice or a table left behind when its data were repacked fails here."""

from __future__ import annotations

import importlib
import re
import shlex

import pytest

from tests.conftest import ROOT

#: The table commands whose whole output is one Markdown table (outlierlab.utils.tables.print_table).
TABLE_COMMANDS = ("ablation_table", "position_profile")
_BLOCK = re.compile(r"((?:^    \S.*\n)+)\n((?:^\|.*\n)+)", re.M)  # an indented command block, a blank line, a table
_COMMAND = re.compile(rf"^python -m outlierlab\.studies\.({'|'.join(TABLE_COMMANDS)}) (.+)$")


def quoted_tables() -> list[tuple[str, str, list[str], list[str]]]:
    """(page, command module, its arguments, the table lines below it) for every block of the docs whose last line
    is a table command and which a table follows."""
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for block, table in _BLOCK.findall(page.read_text()):
            match = _COMMAND.match(block.strip().splitlines()[-1].strip())
            if match:
                found.append((page.name, match[1], shlex.split(match[2]), table.strip().splitlines()))
    return found


QUOTED = quoted_tables()


def test_the_docs_print_table_command_outputs():
    # the CPU ladder's page prints three: the markers by position, the ablation, the ablation by position
    assert len([q for q in QUOTED if q[0] == "ladder_cpu.md"]) >= 3


@pytest.mark.parametrize("page,command,args,table", QUOTED, ids=[f"{q[0]}:{q[1]}:{i}" for i, q in enumerate(QUOTED)])
def test_a_quoted_table_is_its_command_output(page, command, args, table, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name the committed data relative to the repository
    module = importlib.import_module(f"outlierlab.studies.{command}")
    assert module.main(args) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert table == printed, f"{page}: the table below `{command} {' '.join(args)}` is not its output"

