"""The position probe and the similarity by distance on every checkpoint of a run, after the fact.

    python -m outlierlab.jobs.checkpoint_probes multirun/objective_positions          # every finished cell
    python -m outlierlab.jobs.checkpoint_probes <run_dir> [--max-sentences 1000] [probe.py overrides ...]

For each ``<run>/checkpoints/step*.ckpt`` (step 0: the random init) this runs ``python probe.py`` -- Luo et al.'s
bias-free position probe and Zuo et al. (2025)'s similarity by distance -- into ``<run>/probe_posthoc/step<N>/``, and
gathers every step into ``position.csv``, ``similarity_by_distance.csv``, ``order_use.csv`` and
``order_use_layers.csv`` there.  Probed steps are skipped, so an interrupted pass continues.
"""

from __future__ import annotations

import argparse
import csv
import re
import shutil
import sys
from pathlib import Path

from outlierlab.utils.tables import write_csv

OUT_SUBDIR = "probe_posthoc"
_STEP = re.compile(r"step(\d+)\.ckpt$")


def step_checkpoints(run_dir: Path) -> dict[int, Path]:
    """``{step: path}`` of the step checkpoints (``last.ckpt`` repeats one of them and is skipped)."""
    paths = sorted((run_dir / "checkpoints").glob("step*.ckpt"))
    return {int(m.group(1)): path for path in paths if (m := _STEP.search(path.name))}


def quoted(value) -> str:
    """A value for Hydra's override grammar, quoted: a sweep cell's path holds '=' and ','."""
    text = str(value)
    quote = "'" if "'" not in text else '"'
    return f"{quote}{text}{quote}"


def _gather(run_out: Path, name: str, steps: list[int]) -> Path | None:
    """Concatenate ``step<N>/<name>`` of every probed step into ``<name>`` with a leading ``step`` column."""
    rows, fields = [], None
    for step in steps:
        src = run_out / f"step{step:07d}" / name
        if not src.is_file():
            continue
        with open(src, newline="") as f:
            reader = csv.DictReader(f)
            fields = fields or ["step", *reader.fieldnames]
            rows += [{"step": step, **r} for r in reader]
    if fields is None:
        return None
    return write_csv(run_out / name, rows, fields)  # atomic: a reader never sees half a table


#: The tables gathering every probed step (``probe_posthoc/<name>``, from ``probe_posthoc/step<N>/<name>``).
GATHERED = ("position_probe.csv", "similarity_by_distance.csv",
            "order_use.csv",  # whether each checkpoint USES the order its probe decodes
            "order_use_layers.csv")


def gather(run_out: Path, steps: list[int]) -> None:
    """(Re)write every gathered table from the probed ``steps``; a table none of them holds is removed."""
    for name in GATHERED:
        if _gather(run_out, name, steps) is None:
            (run_out / name).unlink(missing_ok=True)


def probe_run(run_dir: str | Path, overrides: list[str] | None = None, max_sentences: int = 1000) -> list[int]:
    """Probe every step checkpoint of ``run_dir`` not probed yet; return the steps probed now."""
    from outlierlab.evaluation.probing import run
    from outlierlab.configuration.composing import compose_config

    run_dir = Path(run_dir)
    checkpoints = step_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(f"{run_dir} holds no checkpoints/step*.ckpt to probe")
    out = run_dir / OUT_SUBDIR
    done = []
    for step, ckpt in sorted(checkpoints.items()):
        dest = out / f"step{step:07d}"
        if (dest / "position_probe.csv").is_file():
            continue
        # features held in memory (features.cache_dir=null): each checkpoint's are encoded once and never reread
        cfg = compose_config("probe", [f"encoder.name_or_path={quoted(ckpt)}", "features.cache_dir=null",
                                       "progress=false", f"data.max_sentences={max_sentences}", *(overrides or [])])
        staging = out / f".step{step:07d}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        run(cfg, staging)
        shutil.rmtree(dest, ignore_errors=True)
        staging.replace(dest)  # a step counts as probed only with all its files
        done.append(step)
        print(f"[checkpoint_probes] {run_dir.name}: step {step} probed", flush=True)
    gather(out, sorted(checkpoints))
    return done


def run_dirs(paths: list[str]) -> list[Path]:
    """Run directories among ``paths``: a run itself (it has checkpoints/) or a sweep holding runs."""
    found = []
    for p in map(Path, paths):
        if (p / "checkpoints").is_dir():
            found.append(p)
        elif p.is_dir():
            found += sorted(d for d in p.iterdir() if (d / "checkpoints").is_dir())
        else:
            raise FileNotFoundError(f"{p} is neither a run directory nor a sweep directory")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="run directories or sweep directories (multirun/<study>)")
    ap.add_argument("--max-sentences", type=int, default=1000, help="held-out sentences probed (probe.py's default)")
    ap.add_argument("--all", dest="finished_only", action="store_false",
                    help="probe the cells whose training did not finish too (default: finished cells only)")
    args, overrides = ap.parse_known_args(argv)
    from outlierlab.jobs.run_state import finished_run  # not via training: no Lightning import to list the cells

    try:
        dirs = run_dirs(args.paths)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for d in dirs:
        if args.finished_only and finished_run(d) is None:
            print(f"[checkpoint_probes] {d}: training not finished, skipped (--all probes it anyway)", flush=True)
            continue
        from outlierlab.utils.dir_lock import RunDirBusy, lock_run_dir  # one writer per run directory
        from outlierlab.jobs.run_state import refresh_manifest

        try:
            with lock_run_dir(d):
                probe_run(d, overrides, args.max_sentences)
                refresh_manifest(d, "checkpoint_probes")  # a finished cell's manifest covers the new files
        except RunDirBusy as e:
            print(f"[checkpoint_probes] skipped: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
