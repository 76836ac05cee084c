"""Shared fixtures: Hydra-composed configs (as lightning-hydra-template does) on temporary run dirs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = str(ROOT / "configs")

# Under pytest-xdist (README: -n 2) each worker is one of the machine's cores: one torch thread each, instead of
# every worker spreading over all cores and the workers fighting for them (2 cores: 7 min 47 s this way against
# 12-13 min in one process, docs/performance.md; train.py's threads=null reads OMP_NUM_THREADS too).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Nothing in the test suite may reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    """Every test caches (tokenizers, packed blocks, features) in a fresh temporary directory: the suite
    never reads or pollutes the user's ~/.cache/outlierlab, and CI timings are those of a cold cache."""
    import tempfile

    os.environ["OUTLIERLAB_CACHE"] = tempfile.mkdtemp(prefix="outlierlab_test_cache_")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
    config._checkout_before = checkout_entries(ROOT)


def pytest_collection_modifyitems(config, items):
    """The test modules holding a ``slow`` test run first, each module kept whole (its module-scoped fixtures are
    built once per worker): pytest-xdist hands tests out in collection order, so a 50-second test started last
    would leave the other worker idle for its length at the end of the run."""
    def module(item):
        return item.nodeid.split("::", 1)[0]

    has_slow = {module(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: module(item) not in has_slow)  # stable: the order inside stays


#: What a test run legitimately leaves in a checkout: Python's and pytest's own caches, the editable install.
RUN_CACHES = ("__pycache__", ".pytest_cache", ".hypothesis", ".egg-info")


def checkout_entries(root: Path) -> set[str] | None:
    """Every path ``git status`` reports in ``root`` — modified, untracked AND ignored, at any depth — as
    ``"XY path"``, less :data:`RUN_CACHES`; None where ``root`` is not a git checkout (or git is missing)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-z", "--untracked-files=all",
                              "--ignored"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {e for e in out.split("\0") if e and not any(c in e for c in RUN_CACHES)}


def pytest_sessionfinish(session, exitstatus):
    """The whole suite's deep check (the per-test fixture below sees only the repository's top level): a path
    that appeared or changed anywhere in the checkout during the run fails the session, named."""
    before = getattr(session.config, "_checkout_before", None)
    after = checkout_entries(ROOT) if before is not None else None
    new = sorted(after - before) if after is not None else []
    if new:
        shown = ", ".join(e[3:] for e in new[:10]) + (f" and {len(new) - 10} more" if len(new) > 10 else "")
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = (f"the test run wrote into the checkout ({ROOT}): {shown} — a test must write under tmp_path; "
               "find which by running the test files one at a time")
        if tr is not None:
            tr.write_line(f"FAILED (checkout written): {msg}", red=True)
        if session.exitstatus == 0:
            session.exitstatus = 1


def compose(config_name: str, overrides: list[str] | None = None):
    """Compose ``configs/<config_name>.yaml`` with overrides, outside of ``@hydra.main``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from outlierlab.configuration.composing import register_resolvers

    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides or [])


@pytest.fixture
def compose_cfg():
    return compose


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    """The session's tokenizer/dataset cache (see pytest_configure), so the corpus is tokenised once."""
    return Path(os.environ["OUTLIERLAB_CACHE"])


@pytest.fixture
def cfg_train(tmp_path, shared_cache):
    """``configs/train.yaml`` composed for a fast CPU test run in a temporary run directory: the suite's small
    model on a corpus slice (``tests/test_train.py: SMALL``; 4 steps of the default model took ~28 s)."""
    from tests.run_fixtures import SMALL

    return compose("train", [f"run_dir={tmp_path}", *SMALL, "trainer.max_steps=4", "trainer.val_check_interval=2",
                             "trainer.limit_val_batches=2"])


@pytest.fixture(autouse=True)
def _nothing_written_into_the_checkout():
    """A test writes only under tmp_path: a run that drops checkpoints or logs into the repository (found:
    ``checkpoints/epoch=2-step=3.ckpt`` after every suite) pollutes the user's checkout and the next run's
    ``git status``.  Fails the test that wrote, naming what appeared at the repository's top level (deeper writes:
    :func:`pytest_sessionfinish`)."""
    before = set(os.listdir(ROOT))
    yield
    new = sorted(set(os.listdir(ROOT)) - before - {".pytest_cache", ".hypothesis"})
    assert not new, f"this test wrote {new} into the repository root ({ROOT}); write under tmp_path"
