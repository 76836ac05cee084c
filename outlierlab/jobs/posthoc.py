"""Outlier statistics of every checkpoint of a finished run, after the fact: the command line.

    python -m outlierlab.jobs.posthoc <run_dir> [--n-sequences 32] [--out DIR]

A ``train.py`` run (``checkpoints/*.ckpt``) goes to ``outlierlab.monitoring.replay.analyze_run``, a transformers
``Trainer`` output directory (``checkpoint-<step>/``) to ``analyze_hf_checkpoints``: the live monitors' trackers replayed
on every checkpoint into ``<run>/monitor_posthoc/`` (``layernorm.csv``, ``hidden_states.csv``, ``order_use.csv``; for a
``train.py`` run also ``metrics.csv``, a row per step and layer, and ``metrics.png``).  A ``train.py`` run is analysed
under its lock and its manifest refreshed.  Imports no Lightning.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from outlierlab.monitoring.replay import OUT_SUBDIR, analyze_hf_checkpoints, analyze_run, find_checkpoints, \
    find_hf_checkpoints


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m outlierlab.jobs.posthoc", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a train.py run directory (with checkpoints/), or a transformers Trainer "
                                        "output_dir (with checkpoint-<step>/ folders)")
    parser.add_argument("--out", default=None, help=f"output folder (default <run_dir>/{OUT_SUBDIR})")
    parser.add_argument("--n-sequences", type=int, default=None, help="held-out sentences (default: the run's monitor)")
    parser.add_argument("--sentences", default=None, help="gzip text file, one sentence per line (default: shipped)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: <run>/hf or <run>/model)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("n_sequences", args.n_sequences), ("sentences_path", args.sentences)) if v is not None}
    kwargs = dict(tokenizer=args.tokenizer, out_dir=args.out, device=args.device, **overrides)
    try:
        if not (Path(args.run_dir) / "checkpoints").is_dir() and find_hf_checkpoints(args.run_dir):
            # a transformers Trainer output_dir (checkpoint-<step>/ folders), e.g. monitored by OutlierMonitorCallback
            res = analyze_hf_checkpoints(args.run_dir, **kwargs)
        else:
            find_checkpoints(args.run_dir)  # fail in a second, before importing torch
            from outlierlab.utils.dir_lock import lock_run_dir  # one writer per run directory
            from outlierlab.jobs.run_state import refresh_manifest

            with lock_run_dir(Path(args.run_dir)):
                res = analyze_run(args.run_dir, **kwargs)
                refresh_manifest(Path(args.run_dir), "posthoc")  # a finished cell's manifest covers the new files
    except (ValueError, FileNotFoundError, OSError, RuntimeError, ImportError) as e:  # ImportError: peft missing
        from outlierlab.jobs.run_errors import disk_full_error, error_line

        # a full disk: the folder and the remedy (the previous generation of outputs is still whole)
        print(f"error: {error_line(e, args.out or args.run_dir) if disk_full_error(e) else e}", file=sys.stderr)
        return 1
    print(f"analysed steps {res['steps']} -> {', '.join(str(res[k]) for k in ('layernorm', 'hidden_states', 'order_use'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
