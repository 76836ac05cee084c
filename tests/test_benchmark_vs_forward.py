"""benchmarks/evaluate_vs_forward.py's bare forward, without timing anything: it must run the model evaluate.py
runs (the same loading: dtype, device, device_map, revision) and count the tokens it saw."""

from __future__ import annotations

import importlib.util

import torch

from tests.conftest import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("evaluate_vs_forward_bench", ROOT / "benchmarks" / "evaluate_vs_forward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bare_forward_runs_evaluates_model_in_its_dtype_and_counts_every_token(tmp_path, compose_cfg, monkeypatch):
    from probe_fixtures import SENTENCES, minilm_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    from outlierlab.models.loading import FrozenEncoder

    tok = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    cfg = compose_cfg("evaluate", [f"encoder.name_or_path={tmp_path / 'm'}", "encoder.dtype=bfloat16",
                                   "encoder.device=cpu"])
    built = []
    real = FrozenEncoder.from_config.__func__
    monkeypatch.setattr(FrozenEncoder, "from_config", classmethod(lambda cls, node: built.append(real(cls, node))
                                                                  or built[-1]))
    secs, n_tok = _bench().bare_forward(cfg.encoder, SENTENCES, 3)
    assert n_tok == sum(len(ids) for ids in tok(SENTENCES, truncation=True)["input_ids"]) and secs > 0
    assert len(built) == 1 and {p.dtype for p in built[0].model.parameters()} == {torch.bfloat16}
    assert built[0].device == torch.device("cpu")


def test_the_ratios_divide_by_the_right_forward():
    r = _bench().ratios(30.0, {"outliers": 12.0, "anisotropy": 1.0, "isotropy": 1.0, "self_similarity": 1.0,
                               "wic": 14.0, "sts": 0.0}, fwd=10.0, fwd_wic=10.0)
    assert r["ratio_all"] == 1.5 and r["sentence_analyses_s"] == 15.0 and r["ratio_sentences"] == 1.5
    assert r["ratio_wic"] == 1.4
    assert _bench().ratios(12.0, {"outliers": 12.0}, fwd=10.0, fwd_wic=0.0)["ratio_wic"] is None  # analyses=[...] without WiC
