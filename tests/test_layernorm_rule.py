"""THE LayerNorm-outlier rule (outlierlab.metrics.layernorm_rule; Kovaleva et al. 2021, Puccetti et al. 2022): planted gain-only /
bias-only / both dims, the layer count, what it cannot judge, and the monitor, evaluate.py's outliers analysis and
the ablation flagging identical dims on one checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from outlierlab.metrics.layernorm_rule import LayerNormRule, layernorm_outliers, min_layers_for

D = 48


def row(plant: dict[int, float] | None = None, centre: float = 0.0, seed: int = 0) -> torch.Tensor:
    """D values with small spread around ``centre`` (all |z| < 2) and the planted entries set."""
    g = torch.Generator().manual_seed(seed)
    v = centre + 0.01 * (torch.rand(D, generator=g) - 0.5)
    for dim, x in (plant or {}).items():
        v[dim] = centre + x
    return v


def params(n_layers: int = 4, gain: dict | None = None, bias: dict | None = None, layers=None, extra=None) -> dict:
    """Output + attention-output LayerNorms; ``gain``/``bias`` planted in the output LN of ``layers``."""
    layers = range(n_layers) if layers is None else layers
    out = {}
    for i in range(n_layers):
        out[f"layer.{i}.attention_output"] = (row(centre=1.0, seed=i), row(seed=100 + i))
        out[f"layer.{i}.output"] = (row(gain if i in layers else None, 1.0, seed=200 + i),
                                    row(bias if i in layers else None, seed=300 + i))
    out.update(extra or {})
    return out


def test_gain_only_plant_is_not_flagged_by_default_but_by_gain_and_both_is():
    p = params(gain={5: 2.0}, bias={9: 1.0})  # dim 5 gain only, dim 9 bias only
    assert layernorm_outliers(p).dims == []
    assert layernorm_outliers(p, LayerNormRule(criterion="gain")).dims == [5]
    assert layernorm_outliers(p, LayerNormRule(criterion="bias")).dims == [9]
    assert layernorm_outliers(p, LayerNormRule(criterion="either")).dims == [5, 9]
    both = params(gain={5: 2.0, 30: -1.5}, bias={5: -1.0, 9: 1.0})  # dim 5 outside in both; 30 gain only
    det = layernorm_outliers(both)
    assert det.dims == [5] and det.flagged["layer.0.output"] == [5] and det.counts == {5: 4}
    assert "layer.0.attention_output" not in det.flagged  # default: output LayerNorms only


def test_layer_count_scales_puccettis_more_than_3_of_12():
    assert [min_layers_for("4/12", n) for n in (12, 4, 6, 24, 1)] == [4, 2, 2, 8, 1]
    assert min_layers_for(3, 12) == 3 and min_layers_for("3", 4) == 3 and min_layers_for(0.5, 4) == 2
    for bad in (13, 0, "x/y", 1.5, True):
        with pytest.raises(ValueError):
            min_layers_for(bad, 12)
    one = params(gain={5: 2.0}, bias={5: 1.0}, layers=[2])  # in 1 of 4 layers: below 2 of 4
    det = layernorm_outliers(one)
    assert det.dims == [] and det.counts == {5: 1} and det.min_layers == 2
    assert layernorm_outliers(one, {"min_layers": 1}).dims == [5]
    two = params(gain={5: 2.0}, bias={5: 1.0}, layers=[0, 3])
    assert layernorm_outliers(two).dims == [5]


def test_embeddings_and_head_count_only_when_asked():
    emb = (row({7: 2.0}, 1.0, seed=1), row({7: 1.0}, seed=2))
    p = params(n_layers=1, extra={"embeddings": emb, "head": emb})
    assert layernorm_outliers(p, {"min_layers": 1}).dims == []
    det = layernorm_outliers(p, {"min_layers": 1, "layernorms": ["output", "embeddings"]})
    assert det.dims == [7] and set(det.per_layer) == {"layer.0", "embeddings"}
    det = layernorm_outliers(p, {"min_layers": 2, "layernorms": ["all", "embeddings", "head"]})
    assert det.dims == [7] and det.counts[7] == 2 and det.n_layers == 3


def test_rule_says_what_it_cannot_judge():
    noaffine = {f"layer.{i}.output": (None, None) for i in range(2)}
    det = layernorm_outliers(noaffine)
    assert det.dims == [] and not det.per_layer and "no gain and no bias" in det.describe()
    rms = {f"layer.{i}.output": (row({3: 2.0}, 1.0, seed=i), None) for i in range(2)}
    det = layernorm_outliers(rms)  # a bias-free norm is judged on its gain alone, and says so
    assert det.dims == [3] and det.gain_only == ["layer.0.output", "layer.1.output"] and not det.unjudged
    assert "judged on their gain alone" in det.describe()
    assert layernorm_outliers(rms, {"criterion": "gain"}).dims == [3]
    det = layernorm_outliers(rms, {"criterion": "bias"})
    assert det.dims == [] and "no bias" in det.unjudged["layer.0.output"] and "criterion=gain" in det.describe()
    assert layernorm_outliers({}).describe().endswith("cannot judge (no LayerNorm of those kinds)")
    with pytest.raises(ValueError, match="criterion"):
        LayerNormRule(criterion="gian")
    with pytest.raises(ValueError, match="unknown ln_rule key"):
        LayerNormRule.from_mapping({"params": ["gain"]})


def test_monitor_notices_a_model_without_gains_instead_of_crashing():
    from outlierlab.monitoring.layernorm_tracker import layernorm_outliers_notice

    lns = {"layer.0.output": nn.LayerNorm(8, elementwise_affine=False)}
    assert "nothing to judge" in layernorm_outliers_notice(lns, LayerNormRule())
    assert "no LayerNorm at all" in layernorm_outliers_notice({}, LayerNormRule())
    assert layernorm_outliers_notice({"layer.0.output": nn.LayerNorm(8)}, LayerNormRule()) == ""


# ------------------------------------------------------------------------------- one checkpoint, three callers
def _planted_model(directory: Path) -> Path:
    """A saved tiny model whose rules disagree: dim 7 gain AND bias in every output LN (the rule's dim), dim 3
    gain only in every output LN (old outliers rule), dim 11 bias in every attention-output LN (old monitor)."""
    from outlierlab.models import EncoderConfig, RobertaMaskedLM, save_pretrained
    from probe_fixtures import byte_level_tokenizer

    torch.manual_seed(0)
    tok = byte_level_tokenizer()
    cfg = EncoderConfig(vocab_size=len(tok), hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64,
                        max_len=64, pos={"name": "learned"})
    model = RobertaMaskedLM(cfg).eval()
    with torch.no_grad():
        for key, ln in model.named_layernorms().items():
            ln.weight.normal_(1.0, 0.05)
            ln.bias.normal_(0.0, 0.05)
            if key.endswith(".output"):
                ln.weight[7], ln.bias[7], ln.weight[3] = 3.0, 1.0, 3.0
            elif key.endswith("attention_output"):
                ln.weight[11], ln.bias[11] = 3.0, 1.0
    save_pretrained(model, directory, tokenizer=tok)
    return directory


def test_monitor_outliers_analysis_and_ablation_flag_identical_dims(tmp_path):
    from hydra import compose, initialize_config_dir

    import evaluate
    from outlierlab.monitoring.layernorm_monitor import LayerNormMonitor
    from outlierlab.models.loading import FrozenEncoder
    from probe_fixtures import SENTENCES

    model_dir = _planted_model(tmp_path / "model")
    text = tmp_path / "text.txt"
    text.write_text("\n".join(SENTENCES * 4) + "\n")
    root = Path(__file__).resolve().parent.parent / "configs"
    with initialize_config_dir(config_dir=str(root), version_base=None):
        cfg = compose("evaluate", overrides=[f"encoder.name_or_path={model_dir}", "analyses=[outliers,ablation]",
                                             "transform=[none]", f"data.files=[{text}]", "tensorboard=false",
                                             "progress=false", "ablation.n_random=1", "ablation.max_sentences=16",
                                             "ablation.example=null"])
    out = evaluate.evaluate(cfg, tmp_path / "eval")
    by = {r.name: r.summary for r in out["results"]}
    monitor = LayerNormMonitor(out_dir=str(tmp_path / "monitor"), rule=cfg.ln_rule)
    monitor.tracker.initial = None
    module = nn.Module()
    module.model = FrozenEncoder(str(model_dir), device="cpu").model
    _, summary = monitor.compute(None, module, 0, False)
    assert summary["outliers"].dims == by["outliers"]["layernorm_outlier_dims"] == [7]
    assert by["ablation"]["layernorm_outlier_dims"] == by["ablation"]["outlier_dims"] == [7]
