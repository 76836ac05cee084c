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
