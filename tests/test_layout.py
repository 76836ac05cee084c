"""The layout README promises: every package imports only packages below it (no cycle, no upward import),
and outlierlab/lightning_modules/ holds only LightningModules, callbacks and loggers."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "outlierlab"
# README "Layout", top to bottom; entry scripts and scripts/ sit above all of them
ORDER = ["studies", "jobs", "lightning_modules", "monitoring", "analyses", "evaluation", "reports", "datamodules", "models", "analysis", "utils"]


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {_role(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(_role(node.module))
    return names & set(ORDER)


def _role(module: str) -> str:
    """``outlierlab.models.encoder`` -> ``models``; anything outside the package -> its top-level name."""
    parts = module.split(".")
    return parts[1] if parts[0] == "outlierlab" and len(parts) > 1 else parts[0]


def test_imports_run_one_way():
    rank = {p: i for i, p in enumerate(ORDER)}
    upward = [f"{f.relative_to(ROOT)} imports {t}"
              for pkg in ORDER for f in sorted((PACKAGE / pkg).rglob("*.py"))
              for t in _imported_packages(f) if rank[t] < rank[pkg]]
    assert not upward, "imports against the layout:\n" + "\n".join(upward)


def test_lightning_modules_holds_only_lightning_code():
    allowed_bases = {"LightningModule", "Callback", "Logger", "TensorBoardLogger", "CSVLogger", "Checkpoint",
                     "OnExceptionCheckpoint"}
    offenders = []
    for f in sorted((PACKAGE / "lightning_modules").rglob("*.py")):
        if f.name == "__init__.py":
            continue
        tree = ast.parse(f.read_text())
        bases = {getattr(b, "attr", getattr(b, "id", "")) for n in tree.body if isinstance(n, ast.ClassDef)
                 for b in n.bases}
        if not bases & allowed_bases and not any(b.endswith(("Module", "Callback", "Logger", "Monitor")) for b in bases):
            offenders.append(f"{f.relative_to(ROOT)} (bases: {sorted(bases) or 'no class'})")
    assert not offenders, "not a LightningModule/Callback/Logger module:\n" + "\n".join(offenders)


def test_one_top_level_name_and_no_bare_role_imports():
    """Everything is imported as ``outlierlab.<role>``: a bare ``import models`` / ``from utils import`` would only
    work from the repository root and would shadow (or be shadowed by) other installed packages."""
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+; the project supports 3.10)
    assert 'include = ["outlierlab*"]' in pyproject and "py-modules" not in pyproject
    bare = []
    for f in [*sorted(PACKAGE.rglob("*.py")), *sorted(ROOT.glob("*.py")), *sorted((ROOT / "scripts").rglob("*.py")),
              *sorted((ROOT / "benchmarks").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]:
        tree = ast.parse(f.read_text(), filename=str(f))
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            bare += [f"{f.relative_to(ROOT)}: {m}" for m in mods if m.split(".")[0] in ORDER]
    assert not bare, "bare role imports (write outlierlab.<role>):\n" + "\n".join(bare)


def test_a_module_name_says_what_it_is_once():
    """Module names repeat across the package only where docs/layout.md says why: analysis/<x>.py holds the formulas
    of the evaluate.py analysis analyses/<x>.py, and two more pairs whose packages tell them apart."""
    from collections import defaultdict

    where = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            where[path.stem].append(str(path.parent.relative_to(PACKAGE)))
    repeated = {name: sorted(dirs) for name, dirs in where.items() if len(dirs) > 1}
    formulas_of_an_analysis = {name for name, dirs in repeated.items() if dirs == ["analyses", "analysis"]}
    assert formulas_of_an_analysis == {"frequency", "frequent_tokens", "order_use", "qk_outliers", "sts", "wic"}
    others = {name: dirs for name, dirs in repeated.items() if name not in formulas_of_an_analysis}
    assert others == {"dim_identity": ["analysis", "studies"],  # one monitor history's answer; a study's, over cells
                      "progress": ["lightning_modules/callbacks", "utils"]}  # log lines; the Lightning callback
