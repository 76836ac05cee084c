"""Files that readers never see half-written: a temporary file in the destination's own directory, fsync, ``os.replace``
(atomic on one file system), and an fsync of the directory so the rename survives a crash. (Lightning's ``_atomic_save``
stages in ``$TMPDIR``, making the final move a copy; Lightning issue #21253.)"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["write_atomic", "replace_dir", "fsync_dir", "figure_bytes", "save_figure"]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary file in its own directory, fsync it, ``os.replace`` it over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    payload = data.encode() if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def replace_dir(staging: Path, dest: Path) -> None:
    """Put the complete ``staging`` in place of ``dest``, moved aside first (restored if the rename fails)."""
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        os.replace(dest, old)
    try:
        os.replace(staging, dest)
    except BaseException:
        if old.exists() and not dest.exists():
            os.replace(old, dest)  # the previous generation stays where it was
        raise
    shutil.rmtree(old, ignore_errors=True)
    fsync_dir(dest.parent)


def figure_bytes(fig: Any, **savefig_kwargs: Any) -> bytes:
    """``fig`` (a matplotlib Figure) encoded in memory, PNG unless ``format=`` says otherwise: the one ``savefig``, so a
    kill or full disk never leaves a torn image under the final name (tests/test_figures_atomic.py)."""
    savefig_kwargs.setdefault("format", "png")
    buf = io.BytesIO()
    fig.savefig(buf, **savefig_kwargs)
    return buf.getvalue()


def save_figure(fig: Any, path: str | os.PathLike, **savefig_kwargs: Any) -> Path:
    """Write ``fig`` to ``path`` complete or not at all: encoded by ``figure_bytes``, then ``write_atomic``
    (a reader sees the earlier figure or the new one, never half of one). The format follows ``path``'s suffix
    (``.png``, ``.pdf``, ``.svg``) unless ``format=`` is given; ``savefig_kwargs`` go to ``Figure.savefig``."""
    path = Path(path)
    savefig_kwargs.setdefault("format", path.suffix.lstrip(".").lower() or "png")
    write_atomic(path, figure_bytes(fig, **savefig_kwargs))
    return path


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
