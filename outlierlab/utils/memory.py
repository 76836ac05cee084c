"""Give the memory freed by a large computation back to the operating system (glibc only).

glibc keeps freed heap memory and raises its mmap threshold after large frees, so a bf16 forward's per-layer buffers
stay resident after the pass (+270 MiB for a 1B Llama on CPU, benchmarks/evaluate_memory.py) and a fit allocated right
after adds to them.  ``malloc_trim(0)`` returns the free pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def release_freed_memory() -> bool:
    """``malloc_trim(0)`` on Linux/glibc; returns whether memory was released (False elsewhere)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):  # musl and other libcs have no malloc_trim
        return False
