"""The layout README promises: every package imports only packages below it (no cycle, no upward import),
and lightning_modules/ holds only LightningModules, callbacks and loggers."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# README "Layout", top to bottom; entry scripts and scripts/ sit above all of them
ORDER = ["jobs", "lightning_modules", "evaluation", "reports", "datamodules", "models", "analysis", "utils"]


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names & set(ORDER)


def test_imports_run_one_way():
    rank = {p: i for i, p in enumerate(ORDER)}
    upward = [f"{f.relative_to(ROOT)} imports {t}"
              for pkg in ORDER for f in sorted((ROOT / pkg).rglob("*.py"))
              for t in _imported_packages(f) if rank[t] < rank[pkg]]
    assert not upward, "imports against the layout:\n" + "\n".join(upward)


def test_lightning_modules_holds_only_lightning_code():
    allowed_bases = {"LightningModule", "Callback", "Logger", "TensorBoardLogger", "CSVLogger"}
    offenders = []
    for f in sorted((ROOT / "lightning_modules").rglob("*.py")):
        if f.name == "__init__.py":
            continue
        tree = ast.parse(f.read_text())
        bases = {getattr(b, "attr", getattr(b, "id", "")) for n in tree.body if isinstance(n, ast.ClassDef)
                 for b in n.bases}
        if not bases & allowed_bases and not any(b.endswith(("Module", "Callback", "Logger", "Monitor")) for b in bases):
            offenders.append(f"{f.relative_to(ROOT)} (bases: {sorted(bases) or 'no class'})")
    assert not offenders, "not a LightningModule/Callback/Logger module:\n" + "\n".join(offenders)
