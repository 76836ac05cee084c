"""What a checkout weighs: the tracked files' bytes and counts per top-level folder, and per kind under docs/.

    python scripts/checkout_size.py

A device machine receives a copy of the working tree (64 MiB at most, with whatever a call carries beside it), so
the tracked files are kept small; tests/test_committed_studies.py holds the budget.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tracked_sizes(root: Path = ROOT) -> dict[str, int]:
    """Every tracked file (as ``git ls-files`` names it) with its size in bytes; missing files are left out."""
    names = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True,
                           check=True).stdout.split("\0")
    return {n: (root / n).stat().st_size for n in names if n and (root / n).is_file()}


def kind(name: str) -> str:
    for suffix in (".parquet", ".png", ".csv.xz", ".csv.gz", ".csv", ".md"):
        if name.endswith(suffix):
            return suffix
    return "other"


def main() -> int:
    sizes = tracked_sizes()
    by_top, count_top = Counter(), Counter()
    for name, size in sizes.items():
        top = name.split("/")[0] if "/" in name else "(root)"
        by_top[top] += size
        count_top[top] += 1
    print(f"tracked: {sum(sizes.values()) / 1e6:.1f} MB in {len(sizes)} files")
    for top, size in by_top.most_common():
        print(f"  {top:<14} {size / 1e6:6.1f} MB  {count_top[top]:5d} files")
    docs = {n: s for n, s in sizes.items() if n.startswith("docs/")}
    kinds, kind_count = Counter(), Counter()
    for name, size in docs.items():
        kinds[kind(name)] += size
        kind_count[kind(name)] += 1
    print("docs/ by kind:")
    for k, size in kinds.most_common():
        print(f"  {k:<14} {size / 1e6:6.1f} MB  {kind_count[k]:5d} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
