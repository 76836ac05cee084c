"""Precision and placement of a Hugging Face model: ``encoder.dtype``, ``encoder.device_map``, ``encoder.revision``.

    load_hf_model(source, "bfloat16", "auto")   # accelerate spreads the layers over every GPU, then CPU memory

``dtype="auto"`` keeps the checkpoint's own (``from_pretrained(dtype="auto")``: Pythia float16, most Llama-style
hubs bfloat16).  A ``device_map`` mapping places modules by hand; entries set to ``"disk"`` are offloaded
(accelerate keeps their weights on the ``meta`` device and reads them for each forward — from the safetensors
file itself, or from ``offload_folder``).  The statistics downstream accumulate in float64 whatever the dtype.
"""

from __future__ import annotations

import tempfile

import torch
from torch import nn

from outlierlab.models.encoder_source import EncoderSource, EncoderUnavailableError

#: ``encoder.dtype`` values (the settings check the same tuple before torch loads).
DTYPES = ("float32", "auto", "bfloat16", "float16")


def torch_dtype(name: str):
    """``"auto"`` or the torch dtype named ``name`` (one of :data:`DTYPES`)."""
    if name not in DTYPES:
        raise ValueError(f"encoder.dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return "auto" if name == "auto" else getattr(torch, name)


def load_hf_model(src: EncoderSource, dtype: str = "float32", device_map=None,
                  offload_folder: str | None = None) -> tuple[nn.Module, str | None]:
    """``(AutoModel at src.revision in dtype, placed by device_map; the offload folder used)``.

    A missing model or revision is one :class:`EncoderUnavailableError` line."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    kw = {"dtype": torch_dtype(dtype), "revision": src.revision}
    if device_map is not None:
        kw["device_map"] = device_map
        if offload_folder is None and isinstance(device_map, dict) and "disk" in device_map.values():
            offload_folder = tempfile.mkdtemp(prefix="outlierlab-offload-")
        kw["offload_folder"] = offload_folder
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # "unused lm_head weights" etc. are expected for an encoder
    hf_logging.disable_progress_bar()
    try:
        return AutoModel.from_pretrained(src.model, local_files_only=src.local_files_only, **kw), offload_folder
    except OSError as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise EncoderUnavailableError(f"cannot load model weights of {src.name}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def input_device(model: nn.Module) -> torch.device:
    """Where a device-mapped model takes its token ids: the device of its input embeddings (accelerate's hooks
    move every later activation to its layer's device); CPU when they are offloaded (``meta``)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    dev = emb.weight.device if emb is not None else next(model.parameters()).device
    return torch.device("cpu") if dev.type == "meta" else dev
