"""Reading a ``train.py`` checkpoint file — the one place that knows how.

Lightning's ``load_from_checkpoint`` would rebuild the whole module and import Lightning into ``outlierlab/models/``,
which stays plain torch so probe.py/evaluate.py/post-hoc read a run without a trainer from the checkpoint dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from outlierlab.models.config import EncoderConfig
from outlierlab.models.encoder import RobertaMaskedLM

__all__ = ["read_checkpoint", "model_from_checkpoint"]


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """The checkpoint dict of ``path``, on CPU (``mmap``: tensors read lazily).

    ValueError (one line naming the file) when it cannot be read.  The safe unpickler (``weights_only=True``) is tried
    first; our runs may store omegaconf containers in ``hyper_parameters``, so a full unpickle follows, only for a file
    the user pointed at.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception:  # noqa: BLE001 - the safe unpickler refuses objects our own hparams may hold
        try:
            return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"checkpoint {path} is unreadable ({type(e).__name__}: {str(e)[:120]})") from None


def model_from_checkpoint(ckpt: dict[str, Any], where: str | Path = "checkpoint") -> RobertaMaskedLM:
    """The encoder of a ``train.py`` checkpoint dict, built from ``hyper_parameters['model']`` with the
    ``model.``-prefixed weights, in train mode; ValueError naming ``where`` for another writer's checkpoint."""
    hp = ckpt.get("hyper_parameters") or {}
    if "model" not in hp:
        raise ValueError(f"{where} was not written by train.py (no hyper_parameters['model'])")
    model = RobertaMaskedLM(EncoderConfig.from_dict(dict(hp["model"])))
    state = ckpt["state_dict"]
    prefix = "model." if any(k.startswith("model.roberta.") for k in state) else ""
    model.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    return model
