"""The layout docs/layout.md promises: every package imports only packages below it (no cycle, no upward import),
one file name per module, the installed package reads nothing of the repository around it (the docs generators
are the repository's lab/), the evaluation engine, its analyses and the Python API import no job,
outlierlab/lightning_modules/ holds only LightningModules, callbacks and loggers, and no file of tests/ imports a test
module (shared helpers live in the fixtures and helper modules beside them)."""

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "outlierlab"
# docs/layout.md, top to bottom; entry scripts, api.py, site_runs.py, scored_runs.py, scripts/ and lab/ sit above all
# of them
ORDER = ["studies", "jobs", "evaluation", "lightning_modules", "monitoring", "reports", "configuration", "datamodules",
         "models", "metrics", "utils"]


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, anywhere in it (inside functions too), relative imports made absolute, and the
    modules it names to ``importlib.import_module`` as a literal."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            found += [base, *(f"{base}.{a.name}" for a in node.names)]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append(node.args[0].value)
    return found


def _role(module: str) -> str:
    """``outlierlab.models.encoder`` -> ``models``; anything outside the package -> its top-level name."""
    parts = module.split(".")
    return parts[1] if parts[0] == "outlierlab" and len(parts) > 1 else parts[0]


def test_imports_run_one_way():
    rank = {p: i for i, p in enumerate(ORDER)}
    upward = sorted({f"{f.relative_to(ROOT)} imports {t}"
                     for pkg in ORDER for f in sorted((PACKAGE / pkg).rglob("*.py"))
                     for m in _imports(f) if m.startswith("outlierlab.")
                     for t in [_role(m)] if t in rank and rank[t] < rank[pkg]})
    assert not upward, "imports against the layout:\n" + "\n".join(upward)


def _job_imports(files) -> list[str]:
    return [f"{f.relative_to(ROOT)}: {m}" for f in files for m in _imports(f)
            if m == "outlierlab.jobs" or m.startswith("outlierlab.jobs.")]


def test_evaluation_imports_no_job():
    """The engine, the probes and the analyses (a user's own analysis is written against them) run without the job
    layer: a job calls them, never the other way round.  The configs are composed and checked by configuration/,
    and what a run writes into its directory (the evaluation's and the probe's tables, report and index) is written
    by evaluation/run_writer.py and evaluation/probing.py, for the command line and ``out_dir=`` alike."""
    offenders = _job_imports(sorted((PACKAGE / "evaluation").rglob("*.py")))
    assert not offenders, "evaluation imports the jobs:\n" + "\n".join(offenders)


def test_the_python_api_imports_no_job():
    """``ol.evaluate``, ``ol.probe_positions`` and the named sites stand on the engine and the configuration alone."""
    offenders = _job_imports([PACKAGE / "api.py", PACKAGE / "site_runs.py", PACKAGE / "scored_runs.py"])
    assert not offenders, "the Python API imports the jobs:\n" + "\n".join(offenders)


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
              *sorted((ROOT / "benchmarks").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py")),
              *sorted((ROOT / "lab").rglob("*.py"))]:
        tree = ast.parse(f.read_text(), filename=str(f))
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            bare += [f"{f.relative_to(ROOT)}: {m}" for m in mods if m.split(".")[0] in ORDER]
    assert not bare, "bare role imports (write outlierlab.<role>):\n" + "\n".join(bare)


def test_a_module_name_says_what_it_is_once():
    """No two modules of the package share a file name (``__init__.py`` aside): a name found in a traceback, an
    import or a search names one module.  A formula module and the analysis that applies it are named apart
    (``metrics/wic_thresholds.py``, ``evaluation/analyses/wic.py``)."""
    where = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            where[path.name].append(str(path.parent.relative_to(PACKAGE)))
    repeated = {name: sorted(dirs) for name, dirs in where.items() if len(dirs) > 1}
    assert not repeated, f"module file names used more than once: {repeated}"


def _climbs_out(path: Path, tree: ast.AST) -> list[str]:
    """Where a module walks from ``__file__`` up past the package's own folder (``parents[k]`` / ``.parent``
    chains): what it reaches there is the repository of a source checkout, absent from an installed wheel."""
    depth = len(path.relative_to(PACKAGE).parts)  # parents[depth - 1] is outlierlab/, parents[depth] the repository
    found = []
    for node in ast.walk(tree):
        if not any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node)):
            continue
        if (isinstance(node, ast.Subscript) and getattr(node.value, "attr", "") == "parents"
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)
                and node.slice.value >= depth):
            found.append(f"parents[{node.slice.value}] (line {node.lineno})")
        elif isinstance(node, ast.Attribute) and node.attr == "parent":
            chain, n = 0, node
            while isinstance(n, ast.Attribute) and n.attr == "parent":
                chain, n = chain + 1, n.value
            if chain > depth:  # Path(__file__).parent is the file's own folder
                found.append(f".parent x{chain} (line {node.lineno})")
    return found


def _docs_paths(tree: ast.AST) -> list[str]:
    """String literals naming the repository's ``docs/`` as a path (``root / "docs"``, ``"docs/emergence/..."``);
    docstrings and messages may mention a page, so only literals that are path operands or arguments count."""
    found = []
    for node in ast.walk(tree):
        operands = ([node.left, node.right] if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                    else [*node.args, *(k.value for k in node.keywords)] if isinstance(node, ast.Call) else [])
        for o in operands:
            if isinstance(o, ast.Constant) and isinstance(o.value, str) and (o.value == "docs"
                                                                              or o.value.startswith("docs/")):
                found.append(f"{o.value!r} (line {node.lineno})")
    return found


def test_the_installed_package_reads_no_docs():
    """The docs tables, the committed studies and the reproduction tables are made from the repository (its docs/,
    its committed cells) by lab/, which is not installed.  A module of the package that walked up from its own file
    would find nothing there in an installed wheel; the one that does falls back to the checkout's configs/ only
    where the wheel's copy is absent (an editable install)."""
    outside, docs = {}, {}
    for f in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(f.read_text(), filename=str(f))
        rel = str(f.relative_to(ROOT))
        if _climbs_out(f, tree):
            outside[rel] = _climbs_out(f, tree)
        if _docs_paths(tree):
            docs[rel] = _docs_paths(tree)
    assert not docs, f"modules naming the repository's docs/ as a path (they belong in lab/): {docs}"
    assert set(outside) == {"outlierlab/configuration/overrides.py"}, f"modules reaching outside the package: {outside}"


def test_lab_is_the_repository_s_and_not_imported_by_the_package():
    assert (ROOT / "lab" / "__init__.py").is_file()
    assert 'include = ["outlierlab*"]' in (ROOT / "pyproject.toml").read_text()  # lab/ is not in the wheel
    offenders = [f"{f.relative_to(ROOT)}: {m}" for f in sorted(PACKAGE.rglob("*.py")) for m in _imports(f)
                 if m == "lab" or m.startswith("lab.")]
    assert not offenders, "the package imports lab/, which is not installed:\n" + "\n".join(offenders)


# An import of a test module written out in a string: the script a test runs in a fresh process.
_TEST_MODULE_IMPORT_TEXT = re.compile(r"(?<![\w.])(?:from\s+(?:tests\.)?test_\w+[\w.]*\s+import\b"
                                      r"|from\s+tests\s+import\s+test_\w+|import\s+(?:tests\.)?test_\w+)")


def _is_test_module(name: str) -> bool:
    return any(part.startswith("test_") for part in name.split("."))


def _test_module_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: what`` for every import of a module named ``test_*`` in ``path``: Import and ImportFrom nodes
    anywhere in it (inside functions too, relative ones, a test module named as a member of tests/), and such imports
    written in its string literals (f-strings too): the code a test hands to a subprocess imports like any other."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    rel = path.relative_to(root)
    found = []
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in ast.walk(n) if v is not n}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            if _is_test_module(node.module or ""):
                found.append((node.lineno, f"from {base} import {', '.join(a.name for a in node.names)}"))
            elif (node.module or "").split(".")[-1] in ("", "tests", "parity"):
                found += [(node.lineno, f"from {base} import {a.name}") for a in node.names if _is_test_module(a.name)]
        elif (isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in in_fstring):
            parts = [node] if isinstance(node, ast.Constant) else node.values
            if not any("import" in str(getattr(v, "value", "")) for v in parts):
                continue  # the source segment below costs a pass over the file: only for strings that could hold one
            text = ast.get_source_segment(source, node) or ""
            found += [(node.lineno + text[:m.start()].count("\n"), f"{m.group(0)!r} in a string")
                      for m in _TEST_MODULE_IMPORT_TEXT.finditer(text)]
    return [f"{rel}:{line}: {what}" for line, what in sorted(set(found))]


def test_no_file_of_tests_imports_a_test_module():
    """A test module is what pytest collects, not a library: a helper taken from one drags that module's imports,
    constants and fixtures into every importer (a fresh subprocess included), ties the importer to the name pytest's
    import mode gives the module, and breaks when the module's tests are reorganised.  What several files share lives
    in a fixtures or helper module of tests/ (probe_fixtures.py, ablation_fixtures.py, monitor_fixtures.py,
    cache_fixtures.py, ...)."""
    offenders = [hit for f in sorted((ROOT / "tests").rglob("*.py")) for hit in _test_module_imports(f)]
    assert not offenders, ("test modules imported (move the helper into a fixtures module of tests/):\n"
                           + "\n".join(offenders))


def test_the_test_module_import_check_sees_every_form(tmp_path):
    """The check above finds each way of writing the import, and nothing that only looks like one."""
    sample = tmp_path / "tests" / "test_sample.py"
    sample.parent.mkdir()
    sample.write_text("""import TEST_a
import tests.TEST_b as b
from TEST_c import x
from tests.TEST_d import y
from tests import TEST_e
from .TEST_f import z


def helper(folder):
    import TEST_g
    code = f\"\"\"
import json
from TEST_h import w
print({folder!r})
\"\"\"
    other = "import TEST_i"
    fine = ("from probe_fixtures import SENTENCES", "test_j", "import latest_k", "from contest_l import m")
    return code, other, fine
""".replace("TEST_", "test_"))
    hits = [h.split(": ", 1)[0] for h in _test_module_imports(sample, tmp_path)]
    name = str(Path("tests") / "test_sample.py")
    assert hits == [f"{name}:{n}" for n in (1, 2, 3, 4, 5, 6, 10, 13, 16)], hits

