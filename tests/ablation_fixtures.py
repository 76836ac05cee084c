"""Shared helpers of the ablation tests (tests/test_ablation.py and the tests that score a planted model: sites,
frequency sinks, quantization, frequent tokens, query-key outliers, families): our RobertaMaskedLM with a planted
output-LayerNorm dimension, that model saved, and the context evaluate.py builds for an analysis."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from probe_fixtures import SENTENCES, byte_level_tokenizer

PLANTED_DIM = 7


def tiny_mlm(layers: int = 3, hidden: int = 32, plant: bool = True, seed: int = 0):
    """Our RobertaMaskedLM with non-trivial LayerNorms; ``plant``: a huge gain/bias on dim 7 of every
    OUTPUT LayerNorm (so it is THE 3σ outlier), and word embeddings large enough for peaked predictions."""
    from outlierlab.models import EncoderConfig, RobertaMaskedLM

    torch.manual_seed(seed)
    tok = byte_level_tokenizer()
    cfg = EncoderConfig(vocab_size=len(tok), hidden_size=hidden, num_layers=layers, num_heads=2,
                        intermediate_size=2 * hidden, max_len=64, pos={"name": "learned"})
    model = RobertaMaskedLM(cfg).eval()
    with torch.no_grad():
        model.roberta.embeddings.word_embeddings.weight.normal_(0, 1)
        for key, ln in model.named_layernorms().items():
            ln.weight.normal_(1.0, 0.05)  # no entry is 0 by accident
            ln.bias.normal_(0.0, 0.05).add_(0.2)
            if plant and key.endswith(".output"):
                ln.weight[PLANTED_DIM], ln.bias[PLANTED_DIM] = 30.0, 3.0
    return model, tok


def save_planted(directory: Path) -> Path:
    from outlierlab.models import save_pretrained

    model, tok = tiny_mlm()
    save_pretrained(model, directory, tokenizer=tok)
    return directory


def make_ctx(name: str, encoder, tmp_path: Path, overrides: dict, text_lines=SENTENCES * 6):
    """The context evaluate.py builds for analysis ``name``: the composed evaluate config (every default from
    the YAML), the section's ``files`` set to a temporary text file, then ``overrides``."""
    from conftest import compose
    from outlierlab.evaluation.registry import EvalContext

    text = tmp_path / "text.txt"
    text.write_text("\n".join(text_lines) + "\n")
    root = compose("evaluate", ["progress=false"])
    root = OmegaConf.merge(root, {name: OmegaConf.merge(root[name], {"files": [str(text)]}, overrides)})
    out = tmp_path / "run"
    out.mkdir(exist_ok=True)
    return EvalContext(encoder=encoder, cfg=root[name], root_cfg=root, transforms=["none"], out_dir=out, seed=0)
