"""Load ANY frozen encoder and return every layer's hidden states (probe.py, evaluate.py).

``encoder.name_or_path`` is resolved to a source by ``outlierlab.models.encoder_source`` (a train.py run, an export
or a ``*.ckpt`` of ours, loaded with ``outlierlab.models.load_pretrained``; anything ``AutoModel`` loads, local or
from the HF cache; ``all-minilm-l6-v2``, the default of probe.py), texts to token ids and padded batches by
``outlierlab.models.encoder_inputs``; this module loads and runs the model.  Sequences longer than the model accepts
are truncated with ONE warning counting them (``on_overflow="warn"``) or rejected in one line (``"error"``).

Position index convention (used by the position probe): a token's index in the tokenized sequence,
0 = ``<s>``/``[CLS]``.

Decoders (GPT-2, Pythia, Llama-style; ``outlierlab.models.families``) load the same way: their token
vectors see only their left context (causal attention), and the same pooling rules apply (non-special,
non-pad tokens).  Their tokenizers often have no pad token: the end-of-sequence token pads the batches
(padding is on the right and masked, so it never reaches a real token's vector).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import Tensor

from outlierlab.models import load_pretrained
from outlierlab.models.checkpoint import model_from_checkpoint, read_checkpoint
from outlierlab.models.encoder_inputs import (EncodedBatch, Tokenized, padded, tokenize_texts,
                                              tokenizer_fingerprint)
from outlierlab.models.encoder_source import EncoderSource, EncoderUnavailableError, resolve_encoder
from outlierlab.models.family_spec import usable_positions
from outlierlab.models.placement import DTYPES, input_device, load_hf_model
from outlierlab.utils.progress import progress_bar


# ---------------------------------------------------------------------------------------------- the encoder
def _pos_name(pos) -> str | None:
    """Our position scheme's name from a config's ``pos`` (``{"name": "none", ...}``) or ``outlierlab_pos``."""
    pos = pos.get("name") if isinstance(pos, dict) else pos
    return None if pos is None else str(pos)


class FrozenEncoder:
    """A frozen encoder returning all hidden states: ``encode(texts)`` yields ``EncodedBatch``.

    ``name_or_path``: see the module docstring.  ``max_length``: truncation in tokens, special tokens included (None:
    the model's maximum); ``on_overflow``: ``warn`` (truncate, one warning with the count) or ``error``.  ``device``:
    ``auto`` (CUDA if available), ``cpu``, ``cuda``, ..., where the model goes without a ``device_map``;
    ``batch_size``: the default of ``encode``.  ``dtype``: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (the
    checkpoint's own: Pythia float16, most Llama-style hubs bfloat16); every statistic still accumulates in
    float32/float64.  ``device_map``: accelerate's placement (Hugging Face models only): ``auto`` spreads the layers
    over every GPU, then CPU memory; a mapping ``{module name: device}`` places them by hand (``disk`` offloads to
    ``offload_folder``, default a temporary directory).  ``revision``: hub revision (branch, tag or commit, e.g.
    Pythia's ``step1000``) of the model AND its tokenizer.  ``lm_head``: load a Hugging Face model with its own LM head
    and run its body (the same hidden states as ``AutoModel``), so ``lm_model`` reuses these weights; evaluate.py sets
    it when an analysis scores with the head.

    Attributes: ``n_forward_calls`` (forward passes so far: a cached feature skips the encoder); ``causal`` and
    ``pos`` (whether it is a decoder, and our position scheme's name for a model of ours, None for others), read
    from its config without loading weights.
    """

    def __init__(self, name_or_path: str = "all-minilm-l6-v2", max_length: int | None = None,
                 on_overflow: str = "warn", device: str = "auto", batch_size: int = 32, dtype: str = "float32",
                 device_map: str | dict | None = None, revision: str | None = None,
                 offload_folder: str | None = None, lm_head: bool = False):
        if on_overflow not in ("warn", "error"):
            raise ValueError(f"on_overflow must be 'warn' or 'error', got {on_overflow!r}")
        if dtype not in DTYPES:
            raise ValueError(f"encoder.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.dtype_name, self.device_map, self.offload_folder = dtype, device_map, offload_folder
        self.source = resolve_encoder(name_or_path, revision)
        if device_map is not None and self.source.kind != "hf":
            raise ValueError(f"encoder.device_map applies to Hugging Face models; {name_or_path} is a {self.source.kind} "
                             "model of this project: set encoder.device_map=null (it fits one device)")
        self.on_overflow, self.batch_size = on_overflow, int(batch_size)
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available()
                                   else ("cpu" if device == "auto" else device))
        self._model, self._hf, self.lm_head = None, None, bool(lm_head)
        self.n_forward_calls = 0
        self.tokenizer = self._load_tokenizer()
        self.model_type, self.norm_placement = "outlierlab", "post"  # _read_config sets both for HF models
        self.causal, self.pos = False, None  # and these where the config says
        self.num_layers, self.hidden_size, limit = self._read_config()
        self._set_lengths(limit, max_length, name_or_path)

    @classmethod
    def from_config(cls, node) -> "FrozenEncoder":
        """From an ``encoder`` config section (omegaconf node, mapping or settings object); ``dtype``,
        ``device_map`` and ``revision`` may be absent (float32, one device, main)."""
        get = node.get if hasattr(node, "get") else (lambda k, d=None: getattr(node, k, d))
        dm = get("device_map", None)
        if dm is not None and not isinstance(dm, str):  # an omegaconf DictConfig -> a plain dict for accelerate
            dm = {str(k): v for k, v in dict(dm).items()}
        return cls(str(get("name_or_path")), get("max_length", None), str(get("on_overflow", "warn")),
                   str(get("device", "auto")), int(get("batch_size", 32)), str(get("dtype", "float32") or "float32"),
                   dm, None if get("revision", None) is None else str(get("revision")))

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer, max_length: int | None = None, on_overflow: str = "warn",
                   batch_size: int = 32) -> "FrozenEncoder":
        """A transformers model in memory, used as it is: no copy, no save, on its own device and in its own dtype.

        ``model``: a body (``AutoModel``) or the model with its LM head (``*ForMaskedLM``, ``*ForCausalLM``: the
        analyses that score with the head use it; the hidden states are the body's). It is put in eval mode (dropout
        off) -- ``model.train()`` to go on training -- and read live: the numbers are those of its weights at each
        call. The encoder's feature caches are its own (a new encoder never reuses another's)."""
        import copy
        import uuid

        from outlierlab.models.families import causal_or_masked
        from outlierlab.models.placement import HFModel

        if on_overflow not in ("warn", "error"):
            raise ValueError(f"on_overflow must be 'warn' or 'error', got {on_overflow!r}")
        enc = cls.__new__(cls)
        name = f"{type(model).__name__} in memory"
        enc.source = EncoderSource("hf", "<in memory>", "<in memory>", name, identity={"memory": uuid.uuid4().hex})
        enc.dtype_name, enc.device_map, enc.offload_folder = "auto", None, None
        enc.on_overflow, enc.batch_size, enc.n_forward_calls, enc.lm_head = on_overflow, int(batch_size), 0, True
        first = next(iter(model.parameters()), None)
        enc.device = first.device if first is not None else torch.device("cpu")
        base = getattr(model, "base_model", model)
        objective = causal_or_masked(model.config)
        if base is not model and callable(getattr(model, "get_output_embeddings", None)) \
                and model.get_output_embeddings() is not None:  # the model with its LM head
            enc._hf = HFModel(base, model, objective, "")
        else:
            enc._hf = HFModel(model, None, objective, f"the {type(model).__name__} in memory is a body without its "
                              "LM head (pass the model with its head, e.g. AutoModelForMaskedLM, to score with it)")
        (enc._hf.lm if enc._hf.lm is not None else model).eval()
        enc._model = enc._hf.body
        if tokenizer.pad_token is None and tokenizer.eos_token is not None:  # decoders: pad = eos, masked
            tokenizer = copy.deepcopy(tokenizer)  # the caller's tokenizer stays as it was
            tokenizer.pad_token = tokenizer.eos_token
        enc.tokenizer = tokenizer
        enc.model_type, enc.norm_placement, enc.causal, enc.pos = "outlierlab", "post", False, None
        enc.num_layers, enc.hidden_size, limit = enc._hf_config(model.config)
        enc._set_lengths(limit, max_length, name)
        return enc

    def _set_lengths(self, limit: int, max_length: int | None, name: str) -> None:
        """``model_max_length`` (the model's and its tokenizer's limit) and ``max_length`` (asked, within it)."""
        tok_max = getattr(self.tokenizer, "model_max_length", None) or 10**9
        self.model_max_length = min(limit, tok_max) if tok_max < 10**6 else limit
        # encoder.max_length's rule (EncoderSettings), for the Python API too: 1 leaves no token but the first
        # special one to measure, and 0 read as "no limit" (``max_length or ...`` below)
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 2):
            raise ValueError(f"max_length must be an integer >= 2 or None (the model's {self.model_max_length}), "
                             f"got {max_length!r}")
        if max_length is not None and max_length > self.model_max_length:
            raise ValueError(f"max_length={max_length} exceeds what {name} accepts ({self.model_max_length} tokens)")
        self.max_length = int(max_length or self.model_max_length)

    # -- loading ----------------------------------------------------------------------------------------
    def _load_tokenizer(self):
        # lazy (transformers, here and below): this module is imported by the start-up checks for
        # resolve_encoder, and transformers takes seconds to import
        from transformers import AutoTokenizer

        try:
            # trust_remote_code=False: a tokenizer here never needs custom code, and without an explicit answer
            # transformers reads a remote-code export's config.json through AutoConfig and asks "Do you wish to run
            # the custom code? [y/N]" in a terminal (15 s) before falling back to the plain config
            tok = AutoTokenizer.from_pretrained(self.source.tokenizer, local_files_only=self.source.local_files_only,
                                                revision=self.source.revision, trust_remote_code=False)
        except (OSError, ValueError) as e:
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise EncoderUnavailableError(f"cannot load the tokenizer of {self.source.name}: {first}") from None
        if tok.pad_token is None and tok.eos_token is not None:  # decoders (GPT-2, Llama): pad = eos, masked
            tok.pad_token = tok.eos_token
        return tok

    def _read_config(self) -> tuple[int, int, int]:
        """(layers, hidden size, longest accepted sequence) without loading weights."""
        src = self.source
        if src.kind == "ckpt":
            return self._our_config(self._ckpt_payload()["hyper_parameters"]["model"])
        # ours: outlierlab_config.json, or only the config.json of a remote-code export that transformers re-saved
        # (EncoderConfig's fields plus outlierlab_pos; AutoConfig would need trust_remote_code to read it). A native
        # RoBERTa export's config.json also names outlierlab_pos but holds HF's fields: AutoConfig below reads it.
        files = [Path(src.model) / name for name in ("outlierlab_config.json", "config.json")]
        ours = [json.loads(f.read_text()) for f in files if src.kind == "outlierlab" and f.is_file()]
        ours = [c for c in ours if "num_layers" in c]
        if ours:
            return self._our_config(ours[0])
        from transformers import AutoConfig

        return self._hf_config(AutoConfig.from_pretrained(src.model, local_files_only=src.local_files_only,
                                                          revision=src.revision))

    def _our_config(self, cfg: dict) -> tuple[int, int, int]:
        """``_read_config`` from our model's config (a checkpoint's hyperparameters or an export's JSON)."""
        self.norm_placement, self.causal = str(cfg.get("norm_placement", "post")), bool(cfg.get("causal", False))
        self.pos = _pos_name(cfg.get("pos", cfg.get("outlierlab_pos")))
        return int(cfg["num_layers"]), int(cfg["hidden_size"]), int(cfg["max_len"])

    def _hf_config(self, cfg) -> tuple[int, int, int]:
        """``_read_config`` from a transformers config (read from disk, or a model in memory's own)."""
        self.causal = bool(getattr(cfg, "is_decoder", False))  # our clm runs export as RobertaForCausalLM
        self.pos = _pos_name(getattr(cfg, "outlierlab_pos", None))  # our native export names it; hub models: None
        if self.source.kind == "hf":
            self.model_type = str(getattr(cfg, "model_type", "") or type(cfg).__name__)
        positions = usable_positions(cfg, getattr(cfg, "max_position_embeddings", None) or 10**9)
        return int(cfg.num_hidden_layers), int(cfg.hidden_size), int(positions)

    def _ckpt_payload(self) -> dict:
        if not hasattr(self, "_ckpt"):
            path = self.source.model
            self._ckpt = read_checkpoint(path)
            if "model" not in self._ckpt.get("hyper_parameters", {}):
                raise ValueError(f"{path} is not a train.py checkpoint (no hyper_parameters['model'])")
        return self._ckpt

    @property
    def model(self) -> torch.nn.Module:
        """The frozen model, loaded on first use (a cache hit never loads the weights)."""
        if self._model is None:
            # First use may come from inside forward()'s inference_mode; weights created there would be
            # inference tensors that no later code (e.g. the ablation's in-place zeroing) may modify.
            with torch.inference_mode(False):
                self._model = self._load_model()
        return self._model

    def lm_model(self) -> tuple[torch.nn.Module, bool, str, str]:
        """``(model, has_head, no-head reason, objective)``: this encoder's weights under the model's own LM head.

        Our models (a ``RobertaMaskedLM``) have it already.  A Hugging Face model not yet
        loaded is loaded once, with its head (the encoder then runs its body).  Without a head in the checkpoint
        ``model`` is the body and ``has_head`` False."""
        if self.source.kind != "hf":
            model = self.model
            return model, True, "", "next_token" if getattr(model.config, "causal", False) else "masked_lm"
        if self._model is not None and self._hf.objective is None:
            # The body was loaded as a bare AutoModel before anyone asked for the head (an encoder used before
            # evaluate() could mark it): from_pretrained cannot add a head to loaded weights, so this second load
            # is unavoidable.  The encoder then runs the new body, and the first copy is freed.
            self._model, self._hf = None, None
        self.lm_head = True
        self.model  # noqa: B018 - loads (once) with the head
        hf = self._hf
        return (hf.lm if hf.lm is not None else hf.body), hf.lm is not None, hf.no_head_reason, hf.objective

    @property
    def input_device(self) -> torch.device:
        """Where the token ids go: ``device``, or with a ``device_map`` the input embeddings' device."""
        return self.device if self.device_map is None else input_device(self.model)

    def _load_model(self) -> torch.nn.Module:
        """The model this encoder runs, placed, in eval mode and frozen (with the LM head it belongs to)."""
        src = self.source
        if src.kind == "hf":  # dtype, device_map, revision: outlierlab.models.placement
            self._hf = load_hf_model(src, self.dtype_name, self.device_map, self.offload_folder, self.lm_head)
            self.offload_folder = self._hf.offload_folder
            whole, model = (self._hf.lm if self._hf.lm is not None else self._hf.body), self._hf.body
        else:
            model = (load_pretrained(src.model) if src.kind == "outlierlab"
                     else model_from_checkpoint(self._ckpt_payload(), self.source.model))
            whole = model = model if self.dtype_name == "auto" else model.to(getattr(torch, self.dtype_name))
        if self.device_map is None:  # accelerate has placed a device-mapped model already
            whole.to(self.device)  # in place: the body moves with the head around it
        whole.eval().requires_grad_(False)
        return model

    def family_line(self) -> str:
        """One line for reports: the model family (from the config, no weights loaded) and the norms the
        LayerNorm-outlier rule judges in it, or what to do when the ``model_type`` is not registered."""
        from outlierlab.models.families import UnknownFamilyError, family_for_type

        try:
            family = family_for_type(self.model_type, self.norm_placement, self.causal)
        except UnknownFamilyError as e:
            return str(e)
        roles = {"pre": "both per-layer norms (before the attention and before the MLP)",
                 "reordered": "both per-layer norms (on the attention's and the MLP's output, before each "
                              "residual add)"}.get(family.placement,
                                                  "each layer's output LayerNorm (after the FFN's residual add)")
        return f"{family.describe()}. The LayerNorm-outlier rule's default `output` role judges {roles}."

    @property
    def identity(self) -> dict:
        """What the cached features depend on: weights (file stats / hub revision), tokenizer, max_length."""
        if not hasattr(self, "_tok_fp"):
            self._tok_fp = tokenizer_fingerprint(self.tokenizer)
        out = {**self.source.identity, "kind": self.source.kind, "max_length": self.max_length,
               "tokenizer": self._tok_fp}
        if self.dtype_name != "float32":  # cached fp16 features of a bf16 model differ from float32's
            out["dtype"] = self.dtype_name
        return out

    # -- running ----------------------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str], report: bool = True) -> Tokenized:
        """Token ids (with special tokens) of every text, truncated to ``max_length`` (``tokenize_texts``)."""
        return tokenize_texts(self.tokenizer, texts, self.max_length, self.on_overflow, report)

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Hidden states ``[L+1, B, T, d]`` (float32, on ``self.device``) of one padded batch."""
        out = self._call(input_ids, attention_mask)(True)
        if getattr(out, "hidden_states", None) is None:
            raise ValueError(f"{self.source.name} returned no hidden_states; it is not an encoder AutoModel supports")
        return torch.stack(out.hidden_states).float()

    @torch.inference_mode()
    def forward_layers(self, input_ids: Tensor, attention_mask: Tensor, fn) -> None:
        """One padded batch, each hidden state handed to ``fn(layer, hidden [B, T, d])`` as the model produces
        it (in the model's dtype, on its layer's device): activation memory is one layer, not ``L+1``
        (``outlierlab.models.layer_taps.tap_layers``)."""
        from outlierlab.models.layer_taps import tap_layers

        tap_layers(self.model, self._call(input_ids, attention_mask), fn)

    def _call(self, input_ids: Tensor, attention_mask: Tensor):
        """``call(all_states)``: the body's forward pass over one batch (counted in ``n_forward_calls``)."""
        model = self.model
        input_ids, attention_mask = input_ids.to(self.input_device), attention_mask.to(self.input_device)
        self.n_forward_calls += 1
        if self.source.kind == "hf":
            return lambda all_states: model(input_ids=input_ids, attention_mask=attention_mask,
                                            output_hidden_states=all_states)
        return lambda all_states: model.roberta(input_ids, attention_mask, output_hidden_states=all_states)

    def batches(self, tokenized: Tokenized, batch_size: int | None = None, sort_by_length: bool = False,
                progress: bool = False, layerwise: bool = False) -> Iterator[EncodedBatch]:
        """Run the encoder over pre-tokenized sequences, one padded batch at a time.

        ``layerwise=True`` runs nothing yet: each batch's ``hidden`` is None and its ``layers(fn)`` runs the
        forward, feeding ``fn(layer, hidden [B, T, d])`` one layer at a time (``forward_layers``)."""
        bs = int(batch_size or self.batch_size)
        lengths = torch.tensor(tokenized.lengths)
        order = torch.argsort(lengths, descending=True, stable=True) if sort_by_length else torch.arange(len(lengths))
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        chunks = [order[i:i + bs] for i in range(0, len(order), bs)]
        bar = None
        if progress:  # tqdm on a terminal, plain lines with an ETA in a log file
            bar = progress_bar(len(order), f"[encode] {self.source.name}", unit="sentences")
        for idx in chunks:
            rows = idx.tolist()
            ids, attn, special = padded(tokenized, rows, pad_id)
            if layerwise:
                yield EncodedBatch(None, attn, special, ids, idx, partial(self.forward_layers, ids, attn))
            else:
                yield EncodedBatch(self.forward(ids, attn), attn, special, ids, idx)
            if bar is not None:
                bar.update(len(rows))
        if bar is not None:
            bar.close()

    def encode(self, texts: Sequence[str], batch_size: int | None = None, sort_by_length: bool = False,
               progress: bool = False) -> Iterator[EncodedBatch]:
        """Tokenize ``texts`` and yield ``EncodedBatch`` es (``index`` maps rows back to ``texts``)."""
        yield from self.batches(self.tokenize(texts), batch_size, sort_by_length, progress)

    def __repr__(self) -> str:
        return (f"FrozenEncoder({self.source.name!r}, kind={self.source.kind}, layers={self.num_layers}, "
                f"hidden={self.hidden_size}, max_length={self.max_length}, device={self.device})")
