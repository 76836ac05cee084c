"""The README's promises that a test can keep honest."""

import re

from tests.conftest import ROOT


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Tests\s+```bash\n(.+?)\n```", readme, re.S)
    assert block, "README.md needs a '## Tests' section with a bash block"
    command = block.group(1).split("#")[0].strip()  # a trailing comment explains, the command is what runs
    ci_lines = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert command in ci_lines


def test_readme_lists_every_position_scheme():
    readme = (ROOT / "README.md").read_text()
    for name in (p.stem for p in (ROOT / "configs" / "pos").glob("*.yaml")):
        assert f"`{name}`" in readme or name in readme
