"""Plain progress lines for logs: what a run under ``nohup``, a scheduler or CI shows instead of a bar.

Rich's and tqdm's bars redraw one terminal line with carriage returns; written to a file they are either
silent (Rich draws only on a terminal) or one ever-growing line. When the stream is not a terminal these
helpers print a complete line at most every ``every_s`` seconds::

    [evaluate] pass 1/1: 1,200/5,000 sentences (24%) | 310 sentences/s | elapsed 0:00:04 | ETA 0:00:12

Standard library only, so the encoding passes of probe.py and evaluate.py can use it without Lightning.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from tqdm.auto import tqdm


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default stdout) is an interactive terminal, where a progress bar draws."""
    stream = sys.stdout if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams (pytest's capture) are not terminals
        return False


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (days as hours), or ``?`` when unknown."""
    if seconds is None or seconds != seconds or seconds == float("inf") or seconds < 0:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def eta_seconds(done: float, total: float | None, elapsed: float) -> float | None:
    """Time left at the mean rate so far; None when it cannot be estimated yet."""
    if not total or done <= 0 or elapsed <= 0:
        return None
    return max(0.0, (total - done) * elapsed / done)


class PlainBar:
    """tqdm's stand-in off a terminal: counts work done, prints a plain line at most every ``every_s`` seconds and once
    at the end.

    Drop-in for the part of tqdm's interface the encoding loops use (``update(n)``, ``close()``).  ``total``: units of
    work expected (None: no percentage or ETA); ``desc``: what is running (``"[evaluate] pass 1/1"``); ``unit``: one
    unit's name (``"sentences"``); ``every_s``: minimum seconds between two lines (0: every update); ``stream``:
    default stdout; ``clock``: the time source (tests pass a fake one).
    """

    def __init__(self, total: int | None, desc: str, unit: str = "sentences", every_s: float = 30.0,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, float(every_s)
        self.stream, self.clock = stream, clock
        self.n = 0
        self.start = self.last_print = clock()
        self.closed = False

    def line(self) -> str:
        elapsed = self.clock() - self.start
        done = f"{self.n:,}/{self.total:,}" if self.total else f"{self.n:,}"
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = f"{self.n / elapsed:,.0f} {self.unit}/s" if elapsed > 0 else f"? {self.unit}/s"
        return (f"{self.desc}: {done} {self.unit}{pct} | {rate} | elapsed {format_duration(elapsed)} | "
                f"ETA {format_duration(eta_seconds(self.n, self.total, elapsed))}")

    def _print(self) -> None:
        print(self.line(), file=self.stream or sys.stdout, flush=True)
        self.last_print = self.clock()

    def update(self, n: int = 1) -> None:
        self.n += int(n)
        if self.clock() - self.last_print >= self.every_s:
            self._print()

    def close(self) -> None:
        """Print the final line (once)."""
        if not self.closed:
            self.closed = True
            self._print()


def progress_bar(total: int | None, desc: str, enabled: bool = True, unit: str = "sentences",
                 every_s: float = 30.0, stream: TextIO | None = None):
    """A tqdm bar on a terminal, ``PlainBar`` otherwise, None when disabled.

    tqdm writes to stderr, so the terminal test is on stderr; the lines go to stdout (or ``stream``),
    where ``nohup``/schedulers collect a job's log.
    """
    if not enabled:
        return None
    if is_terminal(sys.stderr):
        return tqdm(total=total, desc=desc, unit=unit[:4], dynamic_ncols=True)
    return PlainBar(total, desc, unit, every_s, stream)
