"""Save/load ``RobertaMaskedLM`` in Hugging Face format or our own.

* ``learned`` and ``none`` encoders are saved as a plain ``RobertaForMaskedLM`` (a causal run as
  ``RobertaForCausalLM`` with ``is_decoder``, so ``AutoModelForCausalLM`` gives our logits), ``config.json`` +
  ``model.safetensors``: ``none`` becomes an all-zero position table and the token-type row our encoder leaves out
  is exported as zeros.  Any HF tool loads the result.
* everything else — other schemes (transformers 5 cannot express them) and any architecture switch — is saved as
  ``outlierlab_config.json`` (the ``EncoderConfig``) + ``model.safetensors`` (``hf_exportable`` says which).  With
  ``remote_code=True`` (train.py) the directory is also a model transformers loads with ``trust_remote_code=True``
  (``auto_map`` and code generated from this package, ``outlierlab.models.remote_code``).

``load_pretrained`` reads either.  A Hugging Face RoBERTa with a non-zero token-type row (``roberta-base``) is imported
exactly by folding that constant row into the position table.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .config import SWITCH_CHOICES, EncoderConfig
from .encoder import RobertaMaskedLM
from .positions import get_scheme

OUR_CONFIG = "outlierlab_config.json"
WEIGHTS = "model.safetensors"
FORMATS = ("auto", "hf", "outlierlab")

log = logging.getLogger(__name__)


def hf_exportable(config: EncoderConfig) -> bool:
    """True when a plain ``RobertaForMaskedLM`` (``RobertaForCausalLM`` if causal) computes exactly this model: a
    ``learned`` or ``none`` scheme and every switch at its default."""
    return get_scheme(config.pos_name).hf_exportable and config.is_plain_roberta


def why_not_hf(config: EncoderConfig) -> str:
    """The settings of ``config`` that a Hugging Face RoBERTa cannot represent (empty if none)."""
    reasons = [] if get_scheme(config.pos_name).hf_exportable else [f"pos={config.pos_name}"]
    reasons += [f"model.{k}={getattr(config, k)}" for k, valid in SWITCH_CHOICES.items()
                if k != "gate" and getattr(config, k) != valid[0]]
    return ", ".join(reasons)


def _hf_config(config: EncoderConfig):
    # lazy: `import models` is part of the start-up checks (resolve_encoder); transformers takes seconds
    from transformers import RobertaConfig

    # a causal run is exactly RobertaForCausalLM (the same body and head, causal mask from is_decoder);
    # outlierlab_pos is recorded for humans and for our importer, transformers ignores it
    return RobertaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size, hidden_act="gelu",
        hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.attention_dropout,
        max_position_embeddings=config.max_position_embeddings, type_vocab_size=1,
        initializer_range=config.initializer_range, layer_norm_eps=config.layer_norm_eps,
        pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        tie_word_embeddings=True, is_decoder=bool(config.causal),
        architectures=["RobertaForCausalLM" if config.causal else "RobertaForMaskedLM"],
        outlierlab_pos=config.pos_name)


def unpadded_state_dict(model: RobertaMaskedLM) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s weights without the ``model.vocab_multiple`` padding rows of the token embedding
    (they are never an input and never predicted): what every export holds, for a config with no padding."""
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    key = "roberta.embeddings.word_embeddings.weight"
    sd[key] = sd[key][: model.config.vocab_size].clone()
    return sd


def to_hf_state_dict(model: RobertaMaskedLM) -> dict[str, torch.Tensor]:
    """Our state dict renamed/completed to ``RobertaForMaskedLM``'s keys."""
    cfg = model.config
    sd = unpadded_state_dict(model)
    d = cfg.hidden_size
    if cfg.pos_name == "none":
        sd["roberta.embeddings.position_embeddings.weight"] = torch.zeros(cfg.max_position_embeddings, d)
    sd["roberta.embeddings.token_type_embeddings.weight"] = torch.zeros(1, d)
    sd["lm_head.decoder.weight"] = sd["roberta.embeddings.word_embeddings.weight"]
    sd["lm_head.decoder.bias"] = sd["lm_head.bias"]
    return sd


def save_pretrained(model: RobertaMaskedLM, directory: str | os.PathLike, tokenizer=None,
                    format: str = "auto", remote_code: bool = False) -> str:
    """Save ``model`` (and ``tokenizer``) to ``directory``; return the format written (``"hf"`` or ``"outlierlab"``).

    ``format="auto"``: Hugging Face where ``hf_exportable``, else ours; ``"hf"``: the same, with one line saying why
    when it falls back; ``"outlierlab"``: always ours.  ``remote_code=True`` adds ``config.json`` with ``auto_map``,
    ``configuration_outlierlab.py`` and ``modeling_outlierlab.py``, so ``AutoModelForMaskedLM`` (or ``...CausalLM``)
    ``.from_pretrained(directory, trust_remote_code=True)`` gives our logits; off by default, train.py turns it on.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; valid: {', '.join(FORMATS)}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    if format == "hf" and not hf_exportable(cfg):
        log.warning("a Hugging Face RoBERTa cannot represent %s; saved %s in outlierlab format instead "
                    "(load it with outlierlab.models.load_pretrained or encoder.name_or_path=)", why_not_hf(cfg), out)
    if format != "outlierlab" and hf_exportable(cfg):
        from transformers import RobertaForCausalLM, RobertaForMaskedLM  # lazy: as in _hf_config

        hf = (RobertaForCausalLM if cfg.causal else RobertaForMaskedLM)(_hf_config(cfg))
        missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
        if unexpected or [k for k in missing if "position_ids" not in k]:
            raise RuntimeError(f"HF export mismatch: missing={missing} unexpected={unexpected}")
        from transformers.utils import logging as hf_logging

        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its "Writing model shards" bar for one small shard, in every run log
        try:
            hf.save_pretrained(out)
        finally:
            if shown:
                hf_logging.enable_progress_bar()
        fmt = "hf"
    else:
        save_file(unpadded_state_dict(model), str(out / WEIGHTS), metadata={"format": "pt"})
        cfg = dataclasses.replace(cfg, vocab_multiple=1)
        (out / OUR_CONFIG).write_text(json.dumps(cfg.to_dict(), indent=2))
        if remote_code:
            from .remote_code import write_remote_code  # lazy: as in _hf_config (reads the model sources)

            write_remote_code(cfg, out)
        fmt = "outlierlab"
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return fmt


def _load_hf_roberta(directory: Path) -> RobertaMaskedLM:
    hf_cfg = json.loads((directory / "config.json").read_text())
    if hf_cfg.get("model_type") != "roberta":
        raise ValueError(f"{directory} holds a {hf_cfg.get('model_type')!r} model; only RoBERTa checkpoints import "
                         "into RobertaMaskedLM (use outlierlab.models.loading for other encoders)")
    if hf_cfg.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"{directory}: hidden_act={hf_cfg['hidden_act']!r} is not supported (only exact gelu)")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} has no *.safetensors weights (re-save with safe_serialization=True)")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    # Bare RobertaModel checkpoints have no "roberta." prefix and no MLM head.
    if not any(k.startswith("roberta.") for k in sd):
        sd = {("roberta." + k if not k.startswith("lm_head.") else k): v for k, v in sd.items()}
    pad = hf_cfg.get("pad_token_id", 1)
    pos_table = sd.pop("roberta.embeddings.position_embeddings.weight")
    tt = sd.pop("roberta.embeddings.token_type_embeddings.weight", None)
    tt_row = tt[0] if tt is not None else torch.zeros(pos_table.shape[1])
    pos_is_zero = bool(pos_table.abs().max() == 0)
    name = "none" if pos_is_zero and bool(tt_row.abs().max() == 0) else "learned"
    config = EncoderConfig(
        vocab_size=hf_cfg["vocab_size"], hidden_size=hf_cfg["hidden_size"], num_layers=hf_cfg["num_hidden_layers"],
        num_heads=hf_cfg["num_attention_heads"], intermediate_size=hf_cfg["intermediate_size"],
        dropout=hf_cfg.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf_cfg.get("attention_probs_dropout_prob", 0.1),
        max_len=hf_cfg["max_position_embeddings"] - pad - 1, pos={"name": name}, pad_token_id=pad,
        bos_token_id=hf_cfg.get("bos_token_id", 0), eos_token_id=hf_cfg.get("eos_token_id", 2),
        layer_norm_eps=hf_cfg.get("layer_norm_eps", 1e-5), initializer_range=hf_cfg.get("initializer_range", 0.02),
        causal=bool(hf_cfg.get("is_decoder", False)))
    if name == "learned":
        table = pos_table + tt_row  # exact: every (non-pad) token adds both rows
        table[pad] = pos_table[pad] + tt_row
        sd["roberta.embeddings.position_embeddings.weight"] = table
    for k in ("lm_head.decoder.weight", "lm_head.decoder.bias", "roberta.embeddings.position_ids"):
        sd.pop(k, None)
    sd = {k: v for k, v in sd.items() if not k.startswith("roberta.pooler.")}
    model = RobertaMaskedLM(config)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith("lm_head.")]  # a bare encoder has no head
    if missing or unexpected:
        raise ValueError(f"{directory}: weights do not match a RoBERTa encoder (missing={missing}, unexpected={unexpected})")
    return model


def load_pretrained(directory: str | os.PathLike) -> RobertaMaskedLM:
    """Load a model saved by ``save_pretrained`` (either format) or any local HF RoBERTa."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"model directory not found: {d}")
    if (d / OUR_CONFIG).exists():
        config = EncoderConfig.from_dict(json.loads((d / OUR_CONFIG).read_text()))
        model = RobertaMaskedLM(config)
        model.load_state_dict(load_file(str(d / WEIGHTS)))
        return model
    if (d / "config.json").exists():
        hf_cfg = json.loads((d / "config.json").read_text())
        if hf_cfg.get("model_type") == "outlierlab":
            # our remote-code export re-saved by transformers (no outlierlab_config.json): config.json holds
            # every EncoderConfig field, and the weights keep our key names
            fields = {f.name for f in dataclasses.fields(EncoderConfig)}
            model = RobertaMaskedLM(EncoderConfig.from_dict({k: v for k, v in hf_cfg.items() if k in fields}))
            sd: dict[str, torch.Tensor] = {}
            for f in sorted(d.glob("*.safetensors")):
                sd.update(load_file(str(f)))
            model.load_state_dict(sd)
            return model
        return _load_hf_roberta(d)
    raise FileNotFoundError(f"{d} holds neither {OUR_CONFIG} nor a Hugging Face config.json")
