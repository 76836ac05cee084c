"""The model families of this research line, keyed by ``config.model_type`` (``FAMILIES``; what each entry
declares: ``outlierlab.models.family_spec.Family``).  Every analysis that needs a model's insides asks this
module (``family_of``), never a regex over parameter names; ``lm_head`` / ``unembedding`` name the model's own
output layer (``get_output_embeddings``).

Written by hand because transformers has no API that lists a model's per-layer norms or says where they sit (each
modeling file names its own, and pre- or post-LN is only visible in its forward code).  What transformers does provide
is used: ``config.model_type`` keys the registry, ``base_model`` roots the paths, ``get_output_embeddings`` is the LM
head, and the auto mappings decide masked-LM vs causal-LM for an unregistered type.  Adding a family is one ``Family``
entry; ``tests/test_families.py`` builds a tiny random model of each type, plants an outlier dim and checks that the
rule finds exactly it.  Our own encoder (``outlierlab``) is resolved from its blocks' placement, so a pre-LN run of
ours and a pre-LN hub model get the same kinds.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from outlierlab.models.family_spec import POST_KINDS, PRE_KINDS, REORDERED_KINDS, Family, base_model

__all__ = ["FAMILIES", "UnknownFamilyError", "family_of", "family_for_type", "model_type_of", "lm_head",
           "unembedding", "is_decoder", "causal_or_masked", "OURS", "OURS_CAUSAL", "ours"]


class UnknownFamilyError(ValueError):
    """The model's ``model_type`` is not in ``FAMILIES``; the message is one line saying how to add it."""


_BERT_NORMS = (("attention.output.LayerNorm", "attention_output"), ("output.LayerNorm", "output"))
_LLAMA_NORMS = (("input_layernorm", "attention_input"), ("post_attention_layernorm", "mlp_input"))

#: The registry.  Module paths checked against transformers 5 (tests/test_families.py builds each one).
FAMILIES: tuple[Family, ...] = (
    Family("bert", ("bert", "roberta", "xlm-roberta", "camembert", "electra", "data2vec-text"), "post", False,
           "encoder.layer", _BERT_NORMS, "embeddings.LayerNorm", None,
           "cls.predictions.transform.LayerNorm|lm_head.layer_norm|generator_predictions.LayerNorm",
           "embeddings.position_embeddings", "learned absolute table", "attention.self", "attention.self.query",
           "attention.self.key", "separate", "output.dense", "LayerNorm", v="attention.self.value",
           attention_out="attention.output.dense", ffn_input="intermediate.dense"),
    Family("deberta-v2", ("deberta-v2", "deberta"), "post", False, "encoder.layer", _BERT_NORMS,
           "embeddings.LayerNorm", None, "cls.predictions.transform.LayerNorm|lm_predictions.lm_head.LayerNorm",
           "embeddings.position_embeddings",
           "disentangled relative attention (He et al. 2021); an absolute table only with position_biased_input",
           "attention.self", "attention.self.query_proj", "attention.self.key_proj", "separate", "output.dense",
           "LayerNorm", v="attention.self.value_proj", attention_out="attention.output.dense",
           ffn_input="intermediate.dense"),
    Family("mpnet", ("mpnet",), "post", False, "encoder.layer",
           (("attention.LayerNorm", "attention_output"), ("output.LayerNorm", "output")), "embeddings.LayerNorm",
           None, "lm_head.layer_norm", "embeddings.position_embeddings",
           "learned absolute table plus relative attention buckets", "attention.attn", "attention.attn.q",
           "attention.attn.k", "separate", "output.dense", "LayerNorm", v="attention.attn.v",
           attention_out="attention.attn.o", ffn_input="intermediate.dense"),
    Family("distilbert", ("distilbert",), "post", False, "transformer.layer",
           (("sa_layer_norm", "attention_output"), ("output_layer_norm", "output")), "embeddings.LayerNorm", None,
           "vocab_layer_norm", "embeddings.position_embeddings", "learned absolute table", "attention",
           "attention.q_lin", "attention.k_lin", "separate", "ffn.lin2", "LayerNorm", v="attention.v_lin",
           attention_out="attention.out_lin", ffn_input="ffn.lin1"),
    Family("modernbert", ("modernbert",), "pre", False, "layers",
           (("attn_norm", "attention_input"), ("mlp_norm", "mlp_input")), "embeddings.norm", "final_norm",
           "head.norm", None, "rotary (RoPE; Su et al. 2021)", "attn", "attn.Wqkv", "attn.Wqkv",
           "qkv", "mlp.Wo", "LayerNorm without bias", optional_norms=("attn_norm",), v="attn.Wqkv",
           attention_out="attn.Wo", ffn_input="mlp.Wi"),
    Family("gpt2", ("gpt2",), "pre", True, "h", (("ln_1", "attention_input"), ("ln_2", "mlp_input")), None, "ln_f",
           None, "wpe", "learned absolute table (wpe)", "attn", "attn.c_attn", "attn.c_attn", "qkv", "mlp.c_proj",
           "LayerNorm", v="attn.c_attn", attention_out="attn.c_proj", ffn_input="mlp.c_fc"),
    Family("gpt_neox", ("gpt_neox",), "pre", True, "layers", _LLAMA_NORMS, None, "final_layer_norm", None, None,
           "rotary (RoPE) on part of each head", "attention", "attention.query_key_value",
           "attention.query_key_value", "head_qkv", "mlp.dense_4h_to_h", "LayerNorm",
           v="attention.query_key_value", attention_out="attention.dense", ffn_input="mlp.dense_h_to_4h"),
    Family("llama-style", ("llama", "mistral", "qwen2", "qwen3"), "pre", True, "layers", _LLAMA_NORMS, None, "norm", None,
           None, "rotary (RoPE)", "self_attn", "self_attn.q_proj", "self_attn.k_proj",
           "separate", "mlp.down_proj", "RMSNorm (gain, no bias)",
           qk_norms=("self_attn.q_norm", "self_attn.k_norm"),  # Qwen3; absent in Llama, Mistral, Qwen2
           v="self_attn.v_proj", attention_out="self_attn.o_proj", ffn_input="mlp.gate_proj", ffn_up="mlp.up_proj"),
    # OLMo (Groeneveld et al. 2024, "OLMo: Accelerating the Science of Language Models"): Llama's block with a
    # LayerNorm without gain or bias ("non-parametric"), so the rule cannot judge it and says so; q/k/v clamped
    # to ±clip_qkv before the rotation where the config sets it
    Family("olmo", ("olmo",), "pre", True, "layers", _LLAMA_NORMS, None, "norm", None, None, "rotary (RoPE)",
           "self_attn", "self_attn.q_proj", "self_attn.k_proj", "separate", "mlp.down_proj",
           "LayerNorm without gain or bias (non-parametric: nothing for the rule to judge)", qk_clip="clip_qkv",
           v="self_attn.v_proj", attention_out="self_attn.o_proj", ffn_input="mlp.gate_proj", ffn_up="mlp.up_proj"),
    # OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious") and OLMo 3 (the same block; sliding-window layers):
    # "reordered norm", x ← x + RMSNorm(f(x)) — Llama's module name post_attention_layernorm, another place —
    # and a QK-norm over the whole q / k projection (not per head) before the rotation
    Family("olmo2", ("olmo2", "olmo3"), "reordered", True, "layers",
           tuple(zip(("post_attention_layernorm", "post_feedforward_layernorm"), REORDERED_KINDS)), None, "norm",
           None, None, "rotary (RoPE; OLMo 3: sliding-window layers beside full ones)", "self_attn",
           "self_attn.q_proj", "self_attn.k_proj", "separate", "mlp.down_proj", "RMSNorm (gain, no bias)",
           qk_norms=("self_attn.q_norm", "self_attn.k_norm"), qk_norm_layout="separate",
           v="self_attn.v_proj", attention_out="self_attn.o_proj", ffn_input="mlp.gate_proj", ffn_up="mlp.up_proj"),
)
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}

#: Our own encoder (``outlierlab.models.encoder.RobertaMaskedLM``): resolved by :func:`family_of` from its blocks.
OURS = {p: Family("outlierlab", ("outlierlab",), p, False, "encoder.layer",
                  tuple(zip(("attention.output.LayerNorm", "output.LayerNorm"), POST_KINDS if p == "post" else PRE_KINDS)),
                  "embeddings.LayerNorm", "encoder.LayerNorm", "lm_head.layer_norm", None,
                  "our position scheme (model.pos; a learned table when pos=learned)", "attention.self",
                  "attention.self.query", "attention.self.key", "separate", "output.dense",
                  "model.norm (LayerNorm, no-affine LayerNorm or RMSNorm)",
                  # the Outlier-Protected block (model.block=op) has no norm in its blocks
                  optional_norms=("attention.output.LayerNorm", "output.LayerNorm"), v="attention.self.value",
                  attention_out="attention.output.dense", ffn_input="intermediate.dense") for p in ("post", "pre")}


#: Our own model trained with ``objective=clm`` (``model.causal``): the same blocks, a decoder.
OURS_CAUSAL = {p: dataclasses.replace(f, decoder=True) for p, f in OURS.items()}


def ours(placement: str = "post", causal: bool = False) -> Family:
    """The family entry of our own model: its norm placement and objective (one entry, either objective)."""
    return (OURS_CAUSAL if causal else OURS)[placement]


def model_type_of(model_or_config) -> str:
    """``config.model_type`` of a Hugging Face model or config; ``outlierlab`` for our own encoder."""
    if hasattr(model_or_config, "named_layernorms"):
        return "outlierlab"
    cfg = getattr(model_or_config, "config", model_or_config)
    return str(getattr(cfg, "model_type", "") or type(model_or_config).__name__)


def family_for_type(model_type: str, placement: str = "post", causal: bool = False) -> Family:
    """The family of a ``model_type`` (``outlierlab`` with the given placement for ours); an unregistered type
    raises ``UnknownFamilyError``, one line naming it and how to add it."""
    if model_type == "outlierlab":
        return ours(placement, causal)
    try:
        return _BY_TYPE[model_type]
    except KeyError:
        known = ", ".join(sorted(_BY_TYPE))
        raise UnknownFamilyError(
            f"model_type {model_type!r} is not in the model-family registry ({known}): add a Family entry naming "
            "its blocks and per-layer norms to FAMILIES in outlierlab/models/families.py; the hidden-state "
            "analyses still run") from None


def family_of(model: nn.Module) -> Family:
    """The ``Family`` of a loaded model (Hugging Face, with or without head, or our own encoder or its body)."""
    from outlierlab.models.encoder import RobertaEncoder  # lazy: the encoder's modules import the registry

    if hasattr(model, "named_layernorms") or isinstance(model, RobertaEncoder):
        layers = list(getattr(getattr(base_model(model), "encoder", None), "layer", []) or [])
        return ours("pre" if layers and getattr(layers[0], "pre_norm", False) else "post",
                    bool(getattr(getattr(model, "config", None), "causal", False)))
    family = family_for_type(model_type_of(model))
    if not family.decoder and _is_decoder_config(getattr(model, "config", None)):
        # an encoder family's body under a causal mask (our clm runs exported as RobertaForCausalLM)
        family = dataclasses.replace(family, decoder=True)
    return family


def _is_decoder_config(config) -> bool:
    """transformers' ``is_decoder`` flag: an encoder architecture run causally (``RobertaForCausalLM``)."""
    return bool(getattr(config, "is_decoder", False)) and not bool(getattr(config, "add_cross_attention", False))


def lm_head(model: nn.Module) -> nn.Module | None:
    """The model's own output layer (the decoder of its MLM head / its LM head): transformers'
    ``get_output_embeddings``; ours: ``lm_head.decoder``.  None for a body without head."""
    if hasattr(model, "named_layernorms"):
        return getattr(getattr(model, "lm_head", None), "decoder", None)
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def unembedding(model: nn.Module) -> Tensor | None:
    """The output layer's weight ``[vocab, d]`` (detached), or None (Macocco et al. 2025 read it row · dim)."""
    head = lm_head(model)
    w = getattr(head, "weight", None)
    return None if w is None else w.detach()


def is_decoder(model: nn.Module) -> bool:
    """Whether the model is causal (a registered decoder family)."""
    try:
        return family_of(model).decoder
    except UnknownFamilyError:
        cfg = getattr(model, "config", None)
        return bool(getattr(cfg, "is_decoder", False))


def causal_or_masked(config) -> str:
    """``masked_lm`` or ``next_token``: the objective of the model's own LM head (registered families by
    their kind; others by which transformers auto class has the config, masked-LM first)."""
    if _is_decoder_config(config):
        return "next_token"
    try:
        return "next_token" if family_for_type(model_type_of(config)).decoder else "masked_lm"
    except UnknownFamilyError:
        from transformers import MODEL_FOR_MASKED_LM_MAPPING  # lazy: heavy import

        return "masked_lm" if type(config) in MODEL_FOR_MASKED_LM_MAPPING else "next_token"
