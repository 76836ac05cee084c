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


def readme_position_schemes(readme: str) -> set[str]:
    """The schemes the README's commands name: the values of ``pos=`` in its bash blocks (``pos=none``,
    ``pos=learned,none``) and the list in such a line's comment (``# ... (also relative, rope)``).  A scheme's name
    anywhere else ("none" in a sentence, "learned positions") is not a usage and does not count."""
    named = set()
    for block in re.findall(r"```bash\n(.+?)\n```", readme, re.S):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            for values in re.findall(r"(?<![\w.])pos=([\w,]+)", command):
                named |= set(values.split(","))
            if "pos=" in command:
                also = re.search(r"\(also ([\w, ]+)\)", comment)
                named |= {w.strip() for w in also.group(1).split(",")} if also else set()
    return named


def test_readme_lists_every_position_scheme():
    schemes = {p.stem for p in (ROOT / "configs" / "pos").glob("*.yaml")}
    named = readme_position_schemes((ROOT / "README.md").read_text())
    assert schemes <= named, f"position schemes no README command names: {sorted(schemes - named)}"
    assert named <= schemes, f"README commands name schemes configs/pos/ lacks: {sorted(named - schemes)}"


def test_the_scheme_check_reads_only_commands():
    prose = "Without positions (none) a model is a bag of words; learned positions, rope and alibi are options.\n"
    assert readme_position_schemes(prose) == set()
    assert readme_position_schemes(prose + "```bash\npython train.py seed=1   # none, rope\n```\n") == set()
    assert readme_position_schemes("```bash\npython train.py pos=rope   # (also alibi, none)\n```\n") == {
        "rope", "alibi", "none"}
