"""Loading a Hugging Face model — the one place that calls ``from_pretrained`` for weights — and its precision and
placement: ``encoder.dtype``, ``encoder.device_map``, ``encoder.revision``.

    load_hf_model(source, "bfloat16", "auto")   # accelerate spreads the layers over every GPU, then CPU memory

``dtype="auto"`` keeps the checkpoint's own.  A ``device_map`` mapping places modules by hand; ``"disk"`` entries are
offloaded (weights on the ``meta`` device, read per forward from the safetensors file or ``offload_folder``). Statistics
downstream accumulate in float64 whatever the dtype.  ``lm_head=True`` loads the model WITH its own LM head
(``families.causal_or_masked``), whose body is the module ``AutoModel`` would give: one copy of the weights.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from outlierlab.models.encoder_source import EncoderSource, EncoderUnavailableError

#: ``encoder.dtype`` values (the settings check the same tuple before torch loads).
DTYPES = ("float32", "auto", "bfloat16", "float16")


def torch_dtype(name: str):
    """``"auto"`` or the torch dtype named ``name`` (one of ``DTYPES``)."""
    if name not in DTYPES:
        raise ValueError(f"encoder.dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return "auto" if name == "auto" else getattr(torch, name)


@dataclass
class HFModel:
    """What ``load_hf_model`` loaded: ``body`` (``AutoModel``'s module, what the frozen encoder runs), ``lm`` (the same
    weights under its own LM head; None without ``lm_head=True`` or without head weights, ``no_head_reason`` saying
    why), ``objective`` (``masked_lm``/``next_token``; None without ``lm_head``) and ``offload_folder``."""

    body: nn.Module
    lm: nn.Module | None = None
    objective: str | None = None
    no_head_reason: str = ""
    offload_folder: str | None = None


def missing_head_keys(model: nn.Module, loading_info: dict) -> list[str]:
    """The LM-head weights a checkpoint lacked (``from_pretrained(..., output_loading_info=True)``): missing keys
    outside the body (``base_model_prefix``).  Non-empty: the head is a random initialisation, not the model's."""
    prefix = getattr(model, "base_model_prefix", "") + "."
    return sorted(k for k in loading_info["missing_keys"] if not k.startswith(prefix))


def load_hf_model(src: EncoderSource, dtype: str = "float32", device_map=None, offload_folder: str | None = None,
                  lm_head: bool = False) -> HFModel:
    """The model at ``src.revision`` in ``dtype``, placed by ``device_map``; with ``lm_head`` its LM-head class.  A
    missing model or revision is one ``EncoderUnavailableError`` line."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    from outlierlab.models.families import causal_or_masked

    kw = {"dtype": torch_dtype(dtype), "revision": src.revision, "local_files_only": src.local_files_only}
    if device_map is not None:
        kw["device_map"] = device_map
        if offload_folder is None and isinstance(device_map, dict) and "disk" in device_map.values():
            offload_folder = tempfile.mkdtemp(prefix="outlierlab-offload-")
        kw["offload_folder"] = offload_folder
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # "unused lm_head weights" etc. are expected for an encoder
    hf_logging.disable_progress_bar()
    try:
        if not lm_head:
            return HFModel(AutoModel.from_pretrained(src.model, **kw), offload_folder=offload_folder)
        objective = causal_or_masked(AutoConfig.from_pretrained(src.model, local_files_only=src.local_files_only,
                                                                revision=src.revision))
        auto, what = ((AutoModelForCausalLM, "next-token (causal LM)") if objective == "next_token"
                      else (AutoModelForMaskedLM, "masked-LM"))
        try:
            model, info = auto.from_pretrained(src.model, output_loading_info=True, **kw)
        except ValueError as e:  # this architecture has no such head class at all
            body = AutoModel.from_pretrained(src.model, **kw)
            return HFModel(body, None, objective, f"{type(body).__name__} has no {what} class ({e})"[:200],
                           offload_folder)
        head_missing = missing_head_keys(model, info)
        if head_missing:  # keep the body only: the head's random initialisation would score nothing real
            reason = (f"the checkpoint has no {what} head weights ({len(head_missing)} missing, e.g. "
                      f"{head_missing[0]}); it is a body without its head")
            return HFModel(model.base_model, None, objective, reason, offload_folder)
        return HFModel(model.base_model, model, objective, "", offload_folder)
    except OSError as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise EncoderUnavailableError(f"cannot load model weights of {src.name}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


@contextmanager
def eager_attention(model: nn.Module):
    """Run ``model`` with eager attention inside the block, then with its own again: only eager attention returns
    probabilities, while the frozen encoder keeps SDPA on the same weights (``set_attn_implementation``).  A model that
    cannot switch (DeBERTa, MPNet) is eager only; ours takes ``output_attentions`` on its eager path."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    can = getattr(model, "_can_set_attn_implementation", None)
    if current in (None, "eager") or can is None or not can():
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(current)


def input_device(model: nn.Module) -> torch.device:
    """Where a device-mapped model takes its token ids: the device of its input embeddings (accelerate's hooks
    move every later activation to its layer's device); CPU when they are offloaded (``meta``)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    dev = emb.weight.device if emb is not None else next(model.parameters()).device
    return torch.device("cpu") if dev.type == "meta" else dev
