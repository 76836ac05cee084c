"""Give the memory freed by a large computation back to the operating system (glibc only).

glibc's allocator keeps freed heap memory for reuse, and raises its mmap threshold after large frees, so the
tens of MiB a bf16 forward allocates per layer stay resident after the pass: +270 MiB for a 1B Llama on
the CPU (benchmarks/evaluate_memory.py).  A fit that allocates its ``[L, d, d]`` state right after the pass
then adds to that instead of reusing it (a fresh large allocation is a new mapping).  ``malloc_trim(0)``
returns the free pages; nothing in torch or the standard library does this, hence by hand.
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
