"""(Re)write a run's model card and optionally push its export to the Hugging Face Hub.

    python -m outlierlab.jobs.export_run <run_dir> [--push-to-hub USER/NAME] [--private] [--message TEXT]

The export is ``<run>/hf/`` (a plain RoBERTa) or ``<run>/model/``; a ``model/`` missing its config or code files
(a full disk) gets them from the installed outlierlab, said in a line.  ``README.md`` is rewritten from the run
directory and a finished run's manifest refreshed.  ``--push-to-hub`` creates the repository if needed and uploads the
export; offline it stops at once with one line.  The run directory is locked while written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from outlierlab.jobs.model_card import write_model_card


class ExportError(RuntimeError):
    """A user error; the message is one actionable line."""


def export_dir_of(run_dir: Path) -> Path:
    """``<run>/hf`` or ``<run>/model``, whichever the run exported; else one line saying what to pass."""
    for sub in ("hf", "model"):
        d = run_dir / sub
        if (d / "config.json").is_file() or (d / "outlierlab_config.json").is_file():
            return d
    if (run_dir / "config.json").is_file() or (run_dir / "outlierlab_config.json").is_file():
        raise ExportError(f"{run_dir} is a model export itself, not a run directory: pass the run directory that "
                          f"holds it ({run_dir.parent})")
    if (run_dir / "trainer_state.json").is_file() or any(run_dir.glob("checkpoint-*")):
        raise ExportError(f"{run_dir} is a transformers Trainer output folder, not a train.py run: its model is saved "
                          "by transformers (trainer.save_model(), trainer.push_to_hub()); this job exports train.py runs")
    if not any(run_dir.iterdir()):
        raise ExportError(f"{run_dir} is empty: pass a train.py run directory (outputs/train/<date>/<time>, "
                          "holding hf/ or model/ once the run finishes)")
    if not (run_dir / "config.yaml").is_file() and not (run_dir / "checkpoints").is_dir():
        raise ExportError(f"{run_dir} is not a train.py run directory (no config.yaml, checkpoints/, hf/ or model/)")
    raise ExportError(f"{run_dir} has no export (hf/ or model/): the run has not finished or ran with export=false; "
                      "train it to the end (train.py resumes it) and run this again")


def export_problems(export: Path) -> list[str]:
    """What keeps ``export`` from loading (``config.json`` or remote-code files missing or empty); [] if none."""
    from outlierlab.models.remote_code import CONFIG_FILE, MODELING_FILE

    problems = []
    config = export / "config.json"
    if not config.is_file():
        problems.append(f"{config}: missing")
    else:
        try:
            json.loads(config.read_text())
        except ValueError:
            problems.append(f"{config}: {'empty' if config.stat().st_size == 0 else 'not valid JSON'}")
    if (export / "outlierlab_config.json").is_file():
        for name in (CONFIG_FILE, MODELING_FILE):
            f = export / name
            if not f.is_file() or f.stat().st_size == 0:
                problems.append(f"{f}: {'missing' if not f.is_file() else 'empty'}")
    return problems


def ensure_remote_code(export: Path) -> bool:
    """Rewrite a ``model/`` export's missing or broken ``config.json`` and code files; True if it wrote them."""
    if not (export / "outlierlab_config.json").is_file() or not export_problems(export):
        return False
    from outlierlab.models.config import EncoderConfig
    from outlierlab.models.remote_code import write_remote_code

    write_remote_code(EncoderConfig.from_dict(json.loads((export / "outlierlab_config.json").read_text())), export)
    return True


def push_to_hub(folder: Path, repo_id: str, private: bool = False, message: str | None = None) -> str:
    """Upload ``folder`` to the model repository ``repo_id`` (created if absent); return its URL.

    Raises
    ------
    ExportError
        One line: offline, not logged in, or the hub refused (the first line of its answer).
    """
    from outlierlab.utils.hub import hub_is_offline

    if hub_is_offline():  # before any hub call: huggingface_hub would otherwise retry for tens of seconds
        raise ExportError(f"cannot push to {repo_id}: the Hugging Face Hub is unreachable (HF_HUB_OFFLINE is set or "
                          "there is no network); run this again on a machine with network and without HF_HUB_OFFLINE")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    api = HfApi()
    try:
        url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                          commit_message=message or f"outlierlab export of {folder.parent.name}")
    except LocalTokenNotFoundError:
        raise ExportError(f"cannot push to {repo_id}: not logged in to the Hugging Face Hub; run `hf auth login` "
                          "or set HF_TOKEN") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ExportError(f"cannot push to {repo_id}: {first}") from None
    return str(url)


def export_run(run_dir: str | Path, repo_id: str | None = None, private: bool = False,
               message: str | None = None) -> dict[str, str]:
    """Remote code where missing, the card, the manifest, and the push; returns what it did (paths, URL)."""
    from outlierlab.utils.dir_lock import lock_run_dir
    from outlierlab.jobs.run_state import refresh_manifest

    run = Path(run_dir)
    if not run.is_dir():
        raise ExportError(f"run directory not found: {run}")
    export = export_dir_of(run)
    done: dict[str, str] = {"export": str(export)}
    with lock_run_dir(run):
        if ensure_remote_code(export):
            done["remote_code"] = ("written now from the installed outlierlab (they were missing or broken; "
                                   "compare the code versions in the card)")
        done["card"] = str(write_model_card(run, export))
        problems = export_problems(export)
        if problems:  # never report (or record in the manifest) an export transformers would refuse
            raise ExportError(f"the export does not load: {'; '.join(problems)}; run this job again to rewrite it")
        refresh_manifest(run, "export_run")  # the card (and config.json) are result files of a finished cell
    if repo_id:
        done["url"] = push_to_hub(export, repo_id, private, message)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m outlierlab.jobs.export_run", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a train.py run directory (holding hf/ or model/)")
    parser.add_argument("--push-to-hub", metavar="REPO_ID", default=None,
                        help="upload the export to this Hugging Face model repository (user/name)")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--message", default=None, help="commit message of the upload")
    args = parser.parse_args(argv)
    from outlierlab.utils.dir_lock import RunDirBusy

    try:
        done = export_run(args.run_dir, args.push_to_hub, args.private, args.message)
    except (ExportError, RunDirBusy, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a full disk or a read-only mount: the file and the remedy, not a traceback
        where = e.filename or args.run_dir
        print(f"error: cannot write {where}: {e.strerror or e}; free space (or make it writable) and run this again "
              "-- every file is written whole or not at all, so the rerun completes the export", file=sys.stderr)
        return 1
    for key, value in done.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
