"""A file on a disk that fills up: what the full-disk tests open instead of the real file."""

from __future__ import annotations

import errno


class FillingFile:
    """Wraps an open file; its writes succeed until ``budget["left"]`` bytes are spent, then write what fits and
    raise ENOSPC, as a filling tmpfs does. ``budget`` is shared, so several files fill one disk."""

    def __init__(self, fh, budget: dict) -> None:
        self.fh, self.budget = fh, budget

    def write(self, data):
        n = min(len(data), self.budget["left"])
        self.fh.write(data[:n])
        self.fh.flush()
        self.budget["left"] -= n
        if n < len(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        return n

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def fill_disk_for(monkeypatch, name: str, left: int = 200) -> dict:
    """Every file opened for writing whose name contains ``name`` fills after ``left`` bytes (:class:`FillingFile`),
    whichever way it is opened: ``open`` (pandas' ``to_csv``, Pillow), ``io.open`` (``Path.write_text``) and the
    atomic writer's ``open`` (:mod:`outlierlab.utils.atomic`). Returns the shared budget."""
    import builtins
    import io
    from pathlib import Path

    from outlierlab.utils import atomic

    budget = {"left": left}

    def filling(opener):
        def open_(file, mode="r", *args, **kwargs):
            fh = opener(file, mode, *args, **kwargs)
            named = isinstance(file, (str, Path)) and name in Path(file).name
            return FillingFile(fh, budget) if named and ("w" in mode or "a" in mode) else fh
        return open_

    monkeypatch.setattr(builtins, "open", filling(builtins.open))
    monkeypatch.setattr(io, "open", filling(io.open))
    monkeypatch.setattr(atomic, "open", filling(builtins.open), raising=False)
    return budget
