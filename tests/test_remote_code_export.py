"""Every model a plain RoBERTa cannot express loads with transformers alone (trust_remote_code) and
gives our logits; the modelling file is generated from outlierlab's own sources and imports no outlierlab.

The whole grid (position scheme x architecture switch x objective, the non-native cells) is exported once and
loaded in ONE subprocess in which ``import outlierlab`` fails (a shim first on PYTHONPATH: outlierlab is installed
editable, so merely leaving the repository is not enough); each cell is then its own test case."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
import torch

from outlierlab.models import EncoderConfig, RobertaMaskedLM, hf_exportable, load_pretrained, save_pretrained
from outlierlab.models import remote_code
from tests.run_fixtures import run_without_outlierlab

SCHEMES = ("learned", "none", "sinusoidal", "relative", "rope", "alibi")
SWITCHES = {
    "default": {},
    "pre": dict(norm_placement="pre"),
    "rmsnorm": dict(norm="rmsnorm"),
    "noaffine": dict(norm="layernorm_noaffine"),
    "clipped": dict(attention="clipped_softmax", clip_gamma=-0.1),
    "gated": dict(attention="gated"),
    "op": dict(block="op"),
}
OBJECTIVES = ("mlm", "clm")


def cell_config(pos: str, switch: str, objective: str) -> EncoderConfig:
    return EncoderConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_len=16,
                         pos={"name": pos}, causal=objective == "clm", **SWITCHES[switch])


CELLS = [(p, s, o) for p in SCHEMES for s in SWITCHES for o in OBJECTIVES if not hf_exportable(cell_config(p, s, o))]


def cell_name(pos: str, switch: str, objective: str) -> str:
    return f"{pos}-{switch}-{objective}"


def trained_looking(config: EncoderConfig) -> RobertaMaskedLM:
    """Weights away from their init (LayerNorm gains, biases, gates), so a mis-mapped tensor shows in the logits."""
    torch.manual_seed(0)
    model = RobertaMaskedLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def batch():
    ids = torch.randint(5, 50, (3, 12), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = 0
    ids[1, 8:] = 1  # right padding: the mask reaches the exported model
    return ids, (ids != 1).long()


#: The check run in the subprocess: outlierlab unimportable, then per cell load / compare / re-save / reload.
CHECK = """
import json, sys
from pathlib import Path

try:
    import outlierlab  # noqa: F401
    sys.exit("outlierlab is importable in the check: the test proves nothing")
except ImportError:
    pass
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.utils import logging

logging.set_verbosity_error()
out = {}
for d in sorted(p for p in Path("cells").iterdir() if p.is_dir()):
    ref = torch.load(d / "ref.pt")
    auto = AutoModelForCausalLM if ref["causal"] else AutoModelForMaskedLM
    model = auto.from_pretrained(d, trust_remote_code=True).eval()
    with torch.no_grad():
        got = model(input_ids=ref["ids"], attention_mask=ref["mask"], output_hidden_states=True)
        model.save_pretrained(d.parent.parent / "resaved" / d.name)
        again = auto.from_pretrained(d.parent.parent / "resaved" / d.name, trust_remote_code=True).eval()
        back = again(input_ids=ref["ids"], attention_mask=ref["mask"]).logits
        base = AutoModel.from_pretrained(d, trust_remote_code=True).eval()
        body = base(input_ids=ref["ids"], attention_mask=ref["mask"], output_hidden_states=True)
    out[d.name] = {
        "class": type(model).__name__,
        "module_file": sys.modules[type(model).__module__].__file__,
        "logits": float((got.logits - ref["logits"]).abs().max()),
        "hidden": max(float((a - b).abs().max()) for a, b in zip(got.hidden_states, ref["hidden"])),
        "roundtrip": float((back - got.logits).abs().max()),
        "body": float((body.last_hidden_state - ref["hidden"][-1]).abs().max()),
        "outlierlab_loaded": any(m == "outlierlab" or m.startswith("outlierlab.") for m in sys.modules
                                 if sys.modules[m] is not None),
    }
Path("results.json").write_text(json.dumps(out))
"""


@pytest.fixture(scope="module")
def grid_results(tmp_path_factory):
    """Export every non-native cell (our weights, remote code, reference logits) and load them all in one
    subprocess without outlierlab; its per-cell results."""
    tmp = tmp_path_factory.mktemp("remote_code_grid")
    ids, mask = batch()
    for pos, switch, objective in CELLS:
        config = cell_config(pos, switch, objective)
        model = trained_looking(config)
        d = tmp / "cells" / cell_name(pos, switch, objective)
        assert save_pretrained(model, d, remote_code=True) == "outlierlab"
        with torch.no_grad():
            out = model(ids, mask, output_hidden_states=True)
        torch.save({"ids": ids, "mask": mask, "logits": out.logits, "hidden": list(out.hidden_states),
                    "causal": config.causal}, d / "ref.pt")
    r = run_without_outlierlab(CHECK, tmp)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads((tmp / "results.json").read_text())


def test_the_grid_covers_every_non_native_cell():
    assert len(CELLS) == 6 * 7 * 2 - 4  # all but learned/none x plain RoBERTa x mlm/clm, which export natively
    assert {(p, s, o) for p, s, o in CELLS if p in ("learned", "none")} == {
        (p, s, o) for p in ("learned", "none") for s in SWITCHES if s != "default" for o in OBJECTIVES}


@pytest.mark.slow
@pytest.mark.parametrize("pos,switch,objective", CELLS, ids=[cell_name(*c) for c in CELLS])
def test_transformers_alone_gives_our_logits(grid_results, pos, switch, objective):
    res = grid_results[cell_name(pos, switch, objective)]
    assert res["class"] == ("OutlierLabForCausalLM" if objective == "clm" else "OutlierLabForMaskedLM")
    assert not res["outlierlab_loaded"]
    assert Path(res["module_file"]).name == "modeling_outlierlab.py" and "hf_modules" in res["module_file"]
    assert res["logits"] <= 1e-5 and res["hidden"] <= 1e-5  # our own code, so in practice 0
    assert res["roundtrip"] <= 1e-6  # transformers' save_pretrained -> from_pretrained
    assert res["body"] <= 1e-5  # AutoModel: the encoder body of the same checkpoint


def test_the_export_is_still_ours(tmp_path):
    """The remote-code files sit beside our format: load_pretrained and the encoder resolver read it as before,
    and a directory re-saved by transformers (no outlierlab_config.json) loads too."""
    from transformers import AutoModelForMaskedLM

    from outlierlab.models.encoder_source import resolve_encoder

    model = trained_looking(cell_config("rope", "gated", "mlm"))
    save_pretrained(model, tmp_path / "m", remote_code=True)
    assert {p.name for p in (tmp_path / "m").iterdir()} >= {"config.json", "outlierlab_config.json",
                                                              "model.safetensors", "configuration_outlierlab.py",
                                                              "modeling_outlierlab.py"}
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["auto_map"] == {"AutoConfig": "configuration_outlierlab.OutlierLabConfig",
                               "AutoModel": "modeling_outlierlab.OutlierLabModel",
                               "AutoModelForMaskedLM": "modeling_outlierlab.OutlierLabForMaskedLM"}
    assert resolve_encoder(str(tmp_path / "m")).kind == "outlierlab"
    ids, mask = batch()
    assert torch.equal(load_pretrained(tmp_path / "m").eval()(ids, mask).logits, model(ids, mask).logits)
    hf = AutoModelForMaskedLM.from_pretrained(tmp_path / "m", trust_remote_code=True)
    hf.save_pretrained(tmp_path / "resaved")
    assert not (tmp_path / "resaved" / "outlierlab_config.json").exists()
    back = load_pretrained(tmp_path / "resaved").eval()
    assert back.config == model.config
    assert torch.equal(back(ids, mask).logits, model(ids, mask).logits)
    assert resolve_encoder(str(tmp_path / "resaved")).kind == "outlierlab"
    # probe.py / evaluate.py read its shape from config.json without trust_remote_code
    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder.__new__(FrozenEncoder)
    enc.source = resolve_encoder(str(tmp_path / "resaved"))
    c = model.config
    assert enc._read_config() == (c.num_layers, c.hidden_size, c.max_len) and enc.causal is False


# ------------------------------------------------------------------------------ the generated modelling file
def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or "").split(".")[0])
    return names


def test_generated_files_import_only_torch_transformers_and_the_stdlib():
    modeling, configuration = remote_code.modeling_source(), remote_code.configuration_source()
    assert _imports(modeling) <= {"__future__", "math", "dataclasses", "typing", "torch", "transformers",
                                  ".configuration_outlierlab"}
    assert _imports(configuration) <= {"copy", "transformers"}
    for text in (modeling, configuration):
        assert "outlierlab" not in _imports(text) and "import outlierlab" not in text
        compile(text, "<generated>", "exec")


def test_generated_file_is_the_training_code():
    """The model classes are outlierlab's own source text, not a copy that could drift."""
    from outlierlab.models import attention, blocks, encoder, positions

    modeling = remote_code.modeling_source()
    for obj in (encoder.RobertaMaskedLM, encoder.RobertaEncoder, blocks.Layer, blocks.OPLayer,
                attention.SelfAttention, attention.HeadGate, positions.RelativeKeyQuery, positions.ALiBiPositions):
        assert inspect.getsource(obj) in modeling, obj.__name__
    assert remote_code.source_digest() in modeling


def test_the_generator_refuses_a_source_that_needs_outlierlab(monkeypatch):
    sources = remote_code._sources()
    sources["blocks"] = sources["blocks"].replace("from .norms import make_norm",
                                                  "from .norms import make_norm\nfrom outlierlab.utils import atomic")
    monkeypatch.setattr(remote_code, "_sources", lambda: sources)
    with pytest.raises(ValueError, match="must be self-contained"):
        remote_code.modeling_source()
    sources["blocks"] = sources["blocks"].replace("from outlierlab.utils import atomic", "from .sites import Site")
    with pytest.raises(ValueError, match="does not carry"):
        remote_code.modeling_source()


def test_loading_the_tokenizer_of_a_remote_code_export_never_asks_to_run_its_code(tmp_path, monkeypatch):
    """transformers asks "Do you wish to run the custom code? [y/N]" (15 s in a terminal) whenever trust_remote_code
    is left unset on a directory whose config.json maps to custom code; our loader answers it (False: a tokenizer
    needs none), so the question is never put."""
    import transformers.dynamic_module_utils as dmu
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from outlierlab.models.loading import FrozenEncoder

    model = trained_looking(EncoderConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4,
                                          intermediate_size=64, max_len=32, pos={"name": "rope"}))
    d = tmp_path / "model"
    assert save_pretrained(model, d, remote_code=True) == "outlierlab"
    words = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4, **{f"w{i}": i for i in range(5, 60)}}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="<unk>")), bos_token="<s>",
                            eos_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>").save_pretrained(d)
    asked = []
    real = dmu.resolve_trust_remote_code

    def recording(trust_remote_code, *a, **k):
        if trust_remote_code is None:
            asked.append(a[0] if a else "?")
            raise ValueError("would ask in a terminal")
        return real(trust_remote_code, *a, **k)

    monkeypatch.setattr(dmu, "resolve_trust_remote_code", recording)
    monkeypatch.setattr("transformers.models.auto.configuration_auto.resolve_trust_remote_code", recording)
    AutoTokenizer.from_pretrained(d)  # left unset: transformers would ask (and falls back when refused)
    assert asked, "the test would not see the question"
    asked.clear()
    enc = FrozenEncoder(str(d))
    assert enc.tokenizer.convert_tokens_to_ids("w5") == 5 and asked == []
