"""Hugging Face ``trust_remote_code`` export of every model a plain RoBERTa cannot express.

transformers has no class for our other position schemes or architecture switches (``outlierlab.models.export``), so
such a model ships its own code, the Hub's convention (``auto_map`` in ``config.json``; docs/export.md):
``configuration_outlierlab.py`` (``OutlierLabConfig``, ``EncoderConfig``'s fields), ``modeling_outlierlab.py``
(GENERATED from ``config.py``, ``norms.py``, ``positions.py``, ``attention.py``, ``blocks.py`` and ``encoder.py`` with
package-relative imports removed, plus thin ``PreTrainedModel`` wrappers whose ``forward`` is ``RobertaMaskedLM``'s:
the code that trained the model, never a drifting copy; a source importing any other ``outlierlab`` module is refused)
and ``config.json`` with ``auto_map``.

The wrappers keep our module names, so our ``model.safetensors`` serves ``load_pretrained`` and ``from_pretrained``, and
``<run>/model/`` is both outlierlab's directory and a Hugging Face one::

    AutoModelForMaskedLM.from_pretrained("<run>/model", trust_remote_code=True)   # objective=mlm
    AutoModelForCausalLM.from_pretrained("<run>/model", trust_remote_code=True)   # objective=clm
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
from pathlib import Path

from outlierlab.utils.atomic import write_atomic

from .config import EncoderConfig

MODEL_TYPE = "outlierlab"
CONFIG_FILE = "configuration_outlierlab.py"
MODELING_FILE = "modeling_outlierlab.py"

#: The modules whose source makes up the exported model, in dependency order (each imports only earlier ones).
SOURCE_MODULES = ("config", "norms", "positions", "attention", "blocks", "encoder")
_HERE = Path(__file__).resolve().parent


def _strip_imports(name: str, text: str) -> str:
    """``text`` without its ``from __future__`` and package-relative imports (the modules are concatenated, so
    the names they import are defined above it)."""
    tree = ast.parse(text, filename=f"{name}.py")
    drop: list[tuple[int, int]] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or node.module == "__future__"):
            if node.level > 0 and node.module not in SOURCE_MODULES:
                raise ValueError(f"outlierlab/models/{name}.py imports .{node.module}, which the remote-code export "
                                 f"does not carry; add it to SOURCE_MODULES ({', '.join(SOURCE_MODULES)})")
            drop.append((node.lineno, node.end_lineno))
    for node in ast.walk(tree):  # also nested (lazy) imports: the exported file must not need the package
        mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        if any(m.split(".")[0] == "outlierlab" for m in mods):
            raise ValueError(f"outlierlab/models/{name}.py imports {mods}; the remote-code export must be "
                             "self-contained (torch and transformers only)")
    lines = text.splitlines()
    for start, end in sorted(drop, reverse=True):
        del lines[start - 1:end]
    return "\n".join(lines).strip() + "\n"


def _sources() -> dict[str, str]:
    return {name: (_HERE / f"{name}.py").read_text() for name in SOURCE_MODULES}


def source_digest() -> str:
    """SHA-256 (16 hex digits) of the model sources the generated file is made of: equal digests, equal code."""
    h = hashlib.sha256()
    for name, text in _sources().items():
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:16]


_WRAPPERS = '''
# =====================================================================================================
# Hugging Face wrappers (outlierlab/models/remote_code.py). The modules above are outlierlab's own; the
# classes below only adapt them to PreTrainedModel: same module names (roberta.*, lm_head.*), so the
# weights load unchanged, and RobertaMaskedLM's own forward.
# =====================================================================================================
from transformers import PreTrainedModel  # noqa: E402
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput  # noqa: E402
from transformers.modeling_outputs import MaskedLMOutput as HFMaskedLMOutput  # noqa: E402

from .configuration_outlierlab import OutlierLabConfig  # noqa: E402

_ENCODER_FIELDS = tuple(f.name for f in dataclasses.fields(EncoderConfig))


def encoder_config(config: OutlierLabConfig) -> EncoderConfig:
    """The EncoderConfig the model was trained with, from the Hugging Face config."""
    return EncoderConfig(**{k: getattr(config, k) for k in _ENCODER_FIELDS})


class OutlierLabPreTrainedModel(PreTrainedModel):
    config_class = OutlierLabConfig
    base_model_prefix = "roberta"
    _no_split_modules = ["Layer", "OPLayer"]

    def _init_weights(self, module):
        # outlierlab's initialisation (from_pretrained uses it only for weights absent from the checkpoint)
        RobertaMaskedLM._init_weights(self, module)
        # non-persistent buffers are functions of the config; transformers may build the model on the meta
        # device, so they are recomputed here, as in __init__
        if isinstance(module, SinusoidalPositionEmbedding):
            base, cfg = float(self.config.pos.get("base", 10000.0)), encoder_config(self.config)
            factor = sinusoidal_scale(cfg.pos.get("scale", 1.0), cfg.initializer_range)
            module.table = sinusoidal_table(cfg.max_len, cfg.hidden_size, base).to(module.table.device) * factor
        elif isinstance(module, ALiBiPositions):
            module.slopes = alibi_slopes(self.config.num_heads).to(module.slopes.device)


class OutlierLabModel(OutlierLabPreTrainedModel):
    """The encoder body (AutoModel): every layer's hidden states, as RobertaModel without pooler."""

    def __init__(self, config: OutlierLabConfig):
        super().__init__(config)
        cfg = encoder_config(config)
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(self, input_ids=None, attention_mask=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, **kwargs):
        # token_type_ids and the like: the model has no segment embedding (RoBERTa's single row is zero)
        out = RobertaEncoder.forward(self, input_ids, attention_mask, bool(output_hidden_states),
                                     bool(output_attentions))
        return BaseModelOutput(last_hidden_state=out.last_hidden_state, hidden_states=out.hidden_states,
                               attentions=out.attentions)


class _WithHead(OutlierLabPreTrainedModel):
    _output = HFMaskedLMOutput

    def __init__(self, config: OutlierLabConfig):
        super().__init__(config)
        self.roberta = OutlierLabModel(config)
        self.lm_head = LMHead(encoder_config(config))
        self.post_init()

    # the training code's own loss paths and norm list
    _next_token_loss = RobertaMaskedLM._next_token_loss
    _vocab = RobertaMaskedLM._vocab
    named_layernorms = RobertaMaskedLM.named_layernorms

    def get_input_embeddings(self):
        return self.roberta.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.roberta.embeddings.word_embeddings = value

    def get_output_embeddings(self):
        return None  # the decoder IS the input embedding matrix (used directly, not a tied copy)

    def forward(self, input_ids=None, attention_mask=None, labels=None, output_hidden_states=None,
                output_attentions=None, return_dict=None, **kwargs):
        """Logits ``[B, T, V]`` at every position; with ``labels`` also the mean cross-entropy (masked tokens,
        or for a causal model next tokens: labels are shifted inside, as transformers' causal LMs do)."""
        out = RobertaMaskedLM.forward(self, input_ids, attention_mask, labels, bool(output_hidden_states),
                                      bool(output_attentions), full_logits=True)
        return self._output(loss=out.loss, logits=out.logits, hidden_states=out.hidden_states,
                            attentions=out.attentions)


class OutlierLabForMaskedLM(_WithHead):
    """Encoder + masked-LM head (AutoModelForMaskedLM), objective=mlm."""


class OutlierLabForCausalLM(_WithHead):
    """Decoder + next-token head (AutoModelForCausalLM), objective=clm: the same blocks under a causal mask.
    No key/value cache: every call runs the whole sequence."""

    _output = CausalLMOutput
'''


def modeling_source() -> str:
    """The text of ``modeling_outlierlab.py``: the six model modules, concatenated, and the wrappers."""
    parts = [f'"""outlierlab model code for transformers (trust_remote_code). GENERATED at export time by\n'
             f"outlierlab/models/remote_code.py from outlierlab/models/{{{','.join(SOURCE_MODULES)}}}.py\n"
             f"(source digest {source_digest()}); do not edit: re-export instead. Imports torch and transformers "
             'only."""\n\nfrom __future__ import annotations\n']
    for name, text in _sources().items():
        body = _strip_imports(name, text)
        parts.append(f"\n# {'=' * 99}\n# outlierlab/models/{name}.py\n# {'=' * 99}\n{body}")
    parts.append(_WRAPPERS)
    return "\n".join(parts)


def configuration_source() -> str:
    """The text of ``configuration_outlierlab.py``: EncoderConfig's fields and defaults as a PretrainedConfig."""
    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in dataclasses.fields(EncoderConfig)}
    return f'''"""OutlierLabConfig for transformers (trust_remote_code). GENERATED at export time by
outlierlab/models/remote_code.py from EncoderConfig (outlierlab/models/config.py, source digest {source_digest()});
do not edit."""

import copy

from transformers import PretrainedConfig

#: EncoderConfig's fields and their defaults; docs: the EncoderConfig docstring in modeling_outlierlab.py
ENCODER_DEFAULTS = {defaults!r}


class OutlierLabConfig(PretrainedConfig):
    model_type = "{MODEL_TYPE}"
    # the names Hugging Face tools read (num_hidden_layers, ...) map onto EncoderConfig's own
    attribute_map = {{"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads"}}

    def __init__(self, **kwargs):
        for key, default in ENCODER_DEFAULTS.items():
            setattr(self, key, kwargs.pop(key, copy.deepcopy(default)))
        # is_decoder: what generic tools (and outlierlab's FrozenEncoder) read to know the mask is causal
        kwargs["is_decoder"] = bool(self.causal)
        # the LM head multiplies by the input embedding matrix itself: there is no second matrix to tie
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)
'''


def hf_config_dict(config: EncoderConfig) -> dict:
    """``config.json`` of the remote-code export: EncoderConfig's fields, ``auto_map`` and the HF names."""
    head = "OutlierLabForCausalLM" if config.causal else "OutlierLabForMaskedLM"
    auto = "AutoModelForCausalLM" if config.causal else "AutoModelForMaskedLM"
    return {
        **config.to_dict(),
        "model_type": MODEL_TYPE,
        "architectures": [head],
        "auto_map": {"AutoConfig": f"{CONFIG_FILE[:-3]}.OutlierLabConfig",
                     "AutoModel": f"{MODELING_FILE[:-3]}.OutlierLabModel",
                     auto: f"{MODELING_FILE[:-3]}.{head}"},
        # generic tools read the longest input here (num_hidden_layers/num_attention_heads are attribute_map
        # aliases of num_layers/num_heads); the model itself reads max_len
        "max_position_embeddings": config.max_len,
        "is_decoder": bool(config.causal),
        "tie_word_embeddings": False,
        # resolve_encoder reads a config.json with this key as one of ours (a directory re-saved by transformers)
        "outlierlab_pos": config.pos_name,
        "outlierlab_source_digest": source_digest(),
    }


def write_remote_code(config: EncoderConfig, directory: str | os.PathLike) -> None:
    """Write ``config.json`` (with ``auto_map``), ``configuration_outlierlab.py`` and ``modeling_outlierlab.py``
    into ``directory``, which holds (or will hold) the model's ``model.safetensors`` in our key names."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config_dict(config)
    # each file complete or absent (a full disk left a 0-byte config.json that transformers refused); config.json
    # last: it is what makes the folder look like a model, so it appears only once the code it maps to is there
    write_atomic(out / CONFIG_FILE, configuration_source())
    write_atomic(out / MODELING_FILE, modeling_source())
    write_atomic(out / "config.json", json.dumps(cfg, indent=2) + "\n")
