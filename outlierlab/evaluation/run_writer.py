"""An evaluation written into a directory (``<name>.csv``, ``report.md``, ``results.json``, figures, TensorBoard): the
only writer of them, for ``python evaluate.py`` and ``ol.evaluate(out_dir=...)`` alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from omegaconf import DictConfig

from outlierlab.evaluation.core import run_analyses
from outlierlab.reports import run_outputs


def evaluate(cfg: DictConfig, run_dir: str | Path, encoder=None, given: Mapping[str, Any] | None = None,
             texts: Sequence[str] | None = None) -> dict:
    """``run_analyses`` with its outputs written into ``run_dir`` (locked); returns results, facts and paths."""
    from outlierlab.utils.dir_lock import lock_run_dir

    run_dir = Path(run_dir)
    with lock_run_dir(run_dir):
        return _evaluate(cfg, run_dir, encoder, given, texts)


def _evaluate(cfg: DictConfig, run_dir: Path, encoder, given, texts) -> dict:
    from outlierlab.reports.evaluation_report import write_outputs
    from outlierlab.utils.tables import joined, write_csv

    run_dir.mkdir(parents=True, exist_ok=True)
    run_outputs.remove_earlier_outputs(run_dir, _RESULTS, _listed, say=("evaluate", "evaluation"))
    tb = None
    if cfg.tensorboard:
        from torch.utils.tensorboard import SummaryWriter  # lazy: only when tensorboard is on

        tb = SummaryWriter(str(run_dir / "tensorboard"))
    try:
        run = run_analyses(cfg, encoder, given, texts, run_dir, tb)
        paths = {}
        for res in run.results:  # side tables (anisotropy_contributions.csv, layernorm.csv, ...)
            for name, (rows, cols) in res.tables.items():
                paths[f"{name}.csv"] = write_csv(run_dir / f"{name}.csv", rows, cols, cell=joined)
        # results.json names every output, so that the next evaluation in this directory removes exactly these; it
        # is written after the tables, so a results.json on disk means they are all there
        run.meta["files"] = outputs_of(run.results, tb is not None)
        paths.update(write_outputs(run_dir, run.results, run.meta, _header(run.meta), run.columns, tb))
    finally:
        if tb is not None:
            tb.close()
    print(f"[evaluate] done in {run.meta['seconds']:.0f} s -> {run_dir} ({', '.join(sorted(paths))})", flush=True)
    return {"results": run.results, "meta": run.meta, "files": paths, "evaluation": run}


#: The two files every evaluation writes: results.json names all its outputs (the index the next run removes by)
_RESULTS = "results.json"
_REPORT = "report.md"


def outputs_of(results: Sequence[Any], tensorboard: bool) -> list[str]:
    """The names, relative to the run directory, of every file an evaluation with these results writes."""
    names = {f"{r.name}.csv" for r in results}
    names |= {f"{t}.csv" for r in results for t in r.tables}
    names |= {Path(f).name for r in results for f in r.figures}
    return run_outputs.output_names(sorted(names | {_REPORT}), _RESULTS, tensorboard)


def _listed(earlier: Any) -> list | None:
    """The files an earlier evaluation's ``results.json`` names (``reports.run_outputs``)."""
    if not isinstance(earlier, dict) or not isinstance(earlier.get("meta"), dict):
        return None  # not an evaluation's results.json: nothing is removed
    files = earlier["meta"].get("files")
    if not isinstance(files, list):
        raise ValueError(f"the directory's {_RESULTS} names no output files: remove its evaluation outputs, or "
                         "evaluate into another directory")
    return files


def _header(meta: dict) -> str:
    lines = [f"# outlierlab evaluation: {meta['encoder']}", "",
             f"- command: `{meta['command']}`",
             f"- encoder: {meta['encoder']} ({meta['encoder_kind']}), {meta['layers']} hidden states "
             f"(layer 0 = embedding output), hidden size {meta['hidden']}, max length {meta['max_length']}, "
             f"device {meta['device']}",
             f"- family: {meta['family']}" + (" Token vectors see only their left context; pooling rules are "
                                              "those of encoders (non-special, non-pad tokens; sentence = mean)."
                                              if "decoder (causal" in meta["family"] else ""),
             f"- analyses: {', '.join(meta['analyses'])}; "
             + (f"transforms side by side: {', '.join(meta['transforms'])}; " if meta.get("transformed", True) else "")
             + f"seed {meta['seed']}; {meta['seconds']:.0f} s in all"]
    from outlierlab.metrics.transforms import FITTED

    fitted = [t for t in meta["transforms"] if t in FITTED] if meta.get("transformed", True) else []
    if fitted:
        label = "/".join({"whiten": "whitening"}.get(t, t) for t in fitted)
        lines.append(f"- **{label} fit (`transform.fit_on={meta['whiten_fit_on']}`)**: outliers/"
                     "anisotropy/isotropy/self-similarity on the evaluation sentences' token vectors; WiC and STS: "
                     + {"eval": "each on its own evaluated data (Su et al. 2021)",
                        "sentences": "the whitener of the evaluation sentences"}.get(
                         meta["whiten_fit_on"], f"the {meta['whiten_fit_on']!r} split of their dataset") +
                     " (details in each section)")
    s = meta.get("sentences")
    if s:
        lines.append(f"- evaluation sentences: {s['n']} from {s['source']}; {s['passes']} streaming pass(es), "
                     f"{s['tokens_encoded']} tokens encoded at {s['tokens_per_s']:.0f} tokens/s")
        lines += [f"- {t}: {info}" for t, info in s["transforms"].items()]
        lines += [f"- note: {n}" for n in s["notes"]]
    return "\n".join(lines)
