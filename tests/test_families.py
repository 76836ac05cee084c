"""Every model family through the one LayerNorm rule, evaluate.py's analyses and probe.py.

Each registered family is a tiny random model saved in its real transformers format (tests/family_models.py)
and loaded back through the project's loaders, with one outlier dim planted in every per-layer norm.
"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from family_models import DECODERS, SPECS, build, plant, save

REGISTERED = [t for t in SPECS if t != "albert"]
PLANTED = 11
#: Norms without gain or bias (OLMo's non-parametric LayerNorm; Groeneveld et al. 2024): nothing to plant or judge.
NON_PARAMETRIC = ("olmo",)


def _per_layer(norms: dict) -> list:
    return [m for k, m in norms.items() if k.startswith("layer.")]


@pytest.mark.parametrize("model_type", REGISTERED)
def test_rule_flags_exactly_the_planted_dim_in_every_family(tmp_path, model_type):
    """Large gain (and bias where the norm has one) on one dim of every per-layer norm: the rule (default
    settings) flags exactly that dim; with bounded noise alone it flags none.  Loaded back from disk through
    load_mlm, i.e. with the family's own LM-head class.  Norms without gain or bias (OLMo): the rule says it
    cannot judge any of them, as for our layernorm_noaffine runs."""
    from outlierlab.metrics.layernorm_rule import layernorm_outliers
    from outlierlab.models.lm_model import load_mlm
    from outlierlab.models.families import family_of
    from outlierlab.models.family_spec import PRE_KINDS, REORDERED_KINDS
    from outlierlab.models.layernorms import layernorm_tensors, model_layernorms

    for dim, expected in ((PLANTED, [PLANTED]), (None, [])):
        model, tok = build(model_type)
        plant(_per_layer(model_layernorms(model)), dim)
        loaded = load_mlm(str(save(model, tok, tmp_path / f"{model_type}_{dim}")), device="cpu")
        family = family_of(loaded.model)
        assert loaded.family is family and loaded.has_mlm_head
        assert loaded.objective == ("next_token" if model_type in DECODERS else "masked_lm")
        det = layernorm_outliers(layernorm_tensors(loaded.layernorms))
        if model_type in NON_PARAMETRIC:  # nothing was planted: there is no parameter to plant in
            per_layer = [k for k in loaded.layernorms if k.startswith("layer.")]
            assert len(per_layer) == 2 * model.config.num_hidden_layers and "final" in loaded.layernorms
            assert not [p for m in loaded.layernorms.values() for p in m.parameters()]
            assert det.dims == [] and not det.flagged and list(det.unjudged) == per_layer, det.describe()
            assert "cannot judge" in det.describe() and "nothing to judge" in det.describe()
            assert f"{len(per_layer)} norms (layer.0.attention_input … " in det.describe()
            continue
        assert det.dims == expected, (model_type, det.describe())
        kinds = {k.split(".", 2)[2] for k in det.flagged}
        if family.placement == "post":
            assert kinds == {"output"}
        else:  # both per-layer norms judged, in the role of the output LayerNorm; a final norm before the head
            assert kinds == set(PRE_KINDS if family.placement == "pre" else REORDERED_KINDS)
            assert "final" in loaded.layernorms
        if dim is not None:  # the report names where the judged norms sit
            assert ("pre-LN: the norms before" in det.describe()) == (family.placement == "pre")
            assert ("reordered norm: the norms on the attention's and the MLP's outputs" in det.describe()) == (
                family.placement == "reordered")
        no_bias = [k for k, (w, b) in layernorm_tensors(loaded.layernorms).items() if b is None and k in det.flagged]
        assert det.gain_only == no_bias and (not no_bias or "gain alone" in det.describe())
    assert model_layernorms(loaded.model).keys() <= loaded.layernorms.keys()


@pytest.mark.parametrize("model_type", ["gpt2", "modernbert", "llama", "olmo2", "olmo3"])
def test_pre_ln_and_reordered_blocks_judge_both_norms_of_a_layer(model_type):
    """A dim planted only in the norms of the MLP (pre-LN: before it; reordered, OLMo 2/3: on its output),
    another only in those of the attention: both are outliers."""
    from outlierlab.metrics.layernorm_rule import layernorm_outliers
    from outlierlab.models.families import family_of
    from outlierlab.models.family_spec import PRE_KINDS, REORDERED_KINDS
    from outlierlab.models.layernorms import layernorm_tensors, model_layernorms, select_layernorms

    model, _ = build(model_type)
    attention, mlp = PRE_KINDS if family_of(model).placement == "pre" else REORDERED_KINDS
    norms = model_layernorms(model)
    plant(select_layernorms(norms, [mlp]).values(), 3)
    plant(select_layernorms(norms, [attention]).values(), 5, seed=1)
    det = layernorm_outliers(layernorm_tensors(norms))
    assert sorted(det.dims) == [3, 5]
    assert layernorm_outliers(layernorm_tensors(norms), {"layernorms": [mlp]}).dims == [3]
    for other in ("attention_output", *{*PRE_KINDS, *REORDERED_KINDS} - {attention, mlp}):
        with pytest.raises(ValueError, match="unknown LayerNorm kind"):
            select_layernorms(norms, [other])  # a kind of another placement: this model has none


def test_our_pre_ln_encoder_gets_the_same_mapping():
    """model.norm_placement=pre: our blocks' norms are judged as a pre-LN hub model's are."""
    from outlierlab.metrics.layernorm_rule import layernorm_outliers
    from outlierlab.models import EncoderConfig, RobertaMaskedLM
    from outlierlab.models.families import family_of
    from outlierlab.models.layernorms import layernorm_tensors, model_layernorms

    def ours(placement):
        cfg = EncoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                            max_len=16, pos={"name": "learned"}, norm_placement=placement)
        return RobertaMaskedLM(cfg)

    pre, post = ours("pre"), ours("post")
    assert family_of(pre).placement == "pre" and family_of(post).placement == "post"
    keys = list(model_layernorms(pre))
    assert keys == ["embeddings", "layer.0.attention_input", "layer.0.mlp_input", "layer.1.attention_input",
                    "layer.1.mlp_input", "final"]
    assert list(model_layernorms(post))[1:3] == ["layer.0.attention_output", "layer.0.output"]
    plant(_per_layer(model_layernorms(pre)), PLANTED)
    det = layernorm_outliers(layernorm_tensors(model_layernorms(pre)))
    assert det.dims == [PLANTED] and set(det.flagged) == {k for k in keys if k.startswith("layer.")}
    proj = family_of(pre).qk_projections(pre)[0]  # the registry's q/k API covers our encoder too
    assert proj.q is pre.roberta.encoder.layer[0].attention.self.query and (proj.num_heads, proj.head_dim) == (2, 16)


def test_unregistered_model_type_is_one_line_and_the_other_analyses_run(tmp_path, compose_cfg):
    """ALBERT is not in the registry: the outliers analysis says so in one line naming it and how to add it;
    anisotropy, ablation, frequency and attention sinks still write their CSVs."""
    import evaluate as evaluate_script

    model, tok = build("albert")
    path = save(model, tok, tmp_path / "albert")
    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"The {w} sat by the window and read a letter." for w in
                              ("captain", "lady", "admiral", "sister", "friend", "cousin") * 6) + "\n")
    cfg = compose_cfg("evaluate", [f"encoder.name_or_path={path}", "progress=false", "tensorboard=false",
                                   "analyses=[outliers,anisotropy,ablation,frequency,attention_sinks]",
                                   f"data.files=[{text}]", "anisotropy.n_sentences=20", "ablation.n_random=1",
                                   "transform=[none]"])
    out = evaluate_script.evaluate(cfg, tmp_path / "run")
    for name in ("outliers", "anisotropy", "ablation", "frequency", "attention_sinks"):
        assert (tmp_path / "run" / f"{name}.csv").is_file(), name
    report = (tmp_path / "run" / "report.md").read_text()
    lines = [ln for ln in report.splitlines() if "model_type 'albert' is not in the model-family registry" in ln]
    assert lines and all("outlierlab/models/families.py" in ln for ln in lines)
    res = {r.name: r for r in out["results"]}
    assert res["ablation"].rows and res["ablation"].rows[0]["condition"] == "intact"


def test_next_token_ablation_of_the_dim_the_lm_head_reads(tmp_path):
    """A stand-in decoder (GPT-2) whose LM head reads only the planted dim: zeroing that dim in its norms
    (both per-layer norms and the final norm) changes the next-token loss far more than as many random dims."""
    from outlierlab.metrics.layernorm_rule import LayerNormRule
    from outlierlab.evaluation.analyses.ablation import run_ablation
    from outlierlab.evaluation.analyses.ln_rule import detect_layernorm_outliers, zeroed_kinds
    from outlierlab.models.lm_model import load_mlm
    from outlierlab.datamodules.scoring_batches import next_token_batches

    model, tok = build("gpt2", tie_word_embeddings=False)
    with torch.no_grad():
        norms = [m for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)]
        plant(norms, PLANTED)
        head = torch.zeros_like(model.lm_head.weight)
        head[:, PLANTED] = torch.randn(head.shape[0], generator=torch.Generator().manual_seed(0))
        model.lm_head.weight.copy_(head)
    loaded = load_mlm(str(save(model, tok, tmp_path / "gpt2")), device="cpu")
    rule = LayerNormRule()
    det = detect_layernorm_outliers(loaded.layernorms, rule)
    assert det.dims == [PLANTED]
    kinds = zeroed_kinds(OmegaConf.create({"layernorms": None}), rule, loaded.layernorms)
    assert kinds == ["output", "final"]
    texts = [f"The {w} walked into the room and sat down near the fire." for w in ("captain", "lady", "admiral")]
    batches = next_token_batches(tok, texts, max_length=32, batch_size=2)
    assert all((b["labels"][:, :-1][b["attention_mask"][:, 1:] == 0] == -100).all() for b in batches)
    out = run_ablation(loaded, batches, kinds, det.dims, n_random=4, seed=0, example="The lady {mask}", top_k=3)
    by = {r["condition"]: r for r in out.rows}
    assert {r["objective"] for r in out.rows} == {"next_token"}
    moved = abs(by["outliers"]["loss"] - by["intact"]["loss"])
    random_moves = [abs(r["loss"] - by["intact"]["loss"]) for r in out.rows if r["condition"] == "random_draw"]
    assert moved > 1.0 and moved > 20 * max(random_moves), (moved, random_moves)
    # with the dim zeroed the head sees nothing: uniform logits, loss = log V
    assert by["outliers"]["loss"] == pytest.approx(math.log(model.config.vocab_size), abs=1e-3)
    assert set(out.examples) == {"intact", "outliers", "random"}


def _planted_sink_gpt2():
    """GPT-2 whose every head puts (almost) all attention on token 0: position 0's table row is the only one
    with a large value on dim m; keys read dim m, queries are a constant (their bias), values and MLPs are 0."""
    model, tok = build("gpt2")
    d, m = model.config.n_embd, 0
    with torch.no_grad():
        model.transformer.wte.weight[:, m] = 0
        model.transformer.wpe.weight[:, m] = 0
        model.transformer.wpe.weight[0, m] = 100.0
        for block in model.transformer.h:
            block.ln_1.weight.fill_(1.0), block.ln_1.bias.zero_()
            block.attn.c_attn.weight.zero_(), block.attn.c_attn.bias.zero_()
            block.attn.c_attn.weight[m, d:2 * d] = 1.0  # keys: dim m of the normalised input
            block.attn.c_attn.bias[:d] = 10.0  # queries: constant
            block.attn.c_proj.weight.zero_(), block.attn.c_proj.bias.zero_()
            block.mlp.c_proj.weight.zero_(), block.mlp.c_proj.bias.zero_()
    return model, tok


def test_attention_sinks_on_a_planted_decoder(tmp_path):
    """All mass on token 0 in a decoder: the first token is the sink (share 1 in every layer and head), and
    the causal mask is respected (no mass on later tokens)."""
    from ablation_fixtures import make_ctx

    from outlierlab.evaluation.analyses.attention_sinks import run
    from outlierlab.models.loading import FrozenEncoder

    model, tok = _planted_sink_gpt2()
    enc = FrozenEncoder(str(save(model, tok, tmp_path / "gpt2")), device="cpu")
    lines = [f"The {w} walked into the room and sat down." for w in ("captain", "lady", "admiral", "friend")]
    res = run(make_ctx("attention_sinks", enc, tmp_path, {"batch_size": 2}, text_lines=lines))
    intact = [r for r in res.rows if r["condition"] == "intact"]
    assert len(intact) == 2 * 2
    assert all(r["bos"] > 0.999 and r["later"] == 0.0 for r in intact)
    assert res.summary["sink_share_bos_intact"] == [1.0, 1.0] and res.summary["max_later_mass"] == 0.0
    assert "Causal mask" in res.markdown and "(respected)" in res.markdown


def test_later_key_mass_tells_causal_from_bidirectional():
    from outlierlab.metrics.attention_mass import first_token_mask, later_key_mass, special_key_masks

    t = 4
    bidirectional = torch.full((1, 1, t, t), 1 / t)
    causal = torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1).unsqueeze(1)
    assert float(later_key_mass(bidirectional)[0]) == pytest.approx((t - 1) / (2 * t))
    assert float(later_key_mass(causal.view(1, 1, t, t))[0]) == 0.0
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]])
    assert first_token_mask(mask).tolist() == [[False, True, False, False], [True, False, False, False]]
    ids = torch.tensor([[9, 5, 6, 0], [7, 8, 0, 0]])
    keys = special_key_masks(ids, None, 6, mask, first_token=True)
    assert keys["bos"].tolist() == first_token_mask(mask).tolist() and keys["eos"][0, 2]


@pytest.mark.parametrize("model_type", ["gpt2", "modernbert", "llama", "olmo", "olmo2", "olmo3"])
def test_family_structure_helpers(model_type):
    """Position table where the family has one, q/k projections split to heads, LM head, inf-norm sites."""
    from outlierlab.models.families import family_of, lm_head, unembedding
    from outlierlab.models.family_spec import split_qk
    from outlierlab.models.sites import InfNormRecorder

    model, tok = build(model_type)
    family = family_of(model)
    pos = family.position_weight(model)
    assert (pos is not None) == (model_type == "gpt2")
    if pos is not None:
        assert pos[0] == "transformer.wpe.weight" and pos[1].shape == (512, 32)
    assert lm_head(model) is model.get_output_embeddings() and unembedding(model).shape == (tok.vocab_size, 32)
    projections = family.qk_projections(model)
    assert len(projections) == 2
    x = torch.randn(3, 32)
    p = projections[0]
    q, k = split_qk(p, p.q(x), p.k(x))
    assert q.shape == (3, p.num_heads, p.head_dim) and k.shape == (3, p.num_kv_heads, p.head_dim)
    ids = tok(["a short sentence", "another"], padding=True, return_tensors="pt")
    with InfNormRecorder(model) as rec, torch.no_grad():
        model(**ids)
        rec.commit(ids["attention_mask"].bool())
    result = rec.result()
    assert all(not math.isnan(float(result[s][l])) for s in ("ffn_output", "ln_input") for l in (1, 2))


# ------------------------------------------------------------------------------------------------ OLMo
def _rotated(monkeypatch, model_type: str) -> list:
    """Record the q and k that the OLMo attention hands to the rotation, ``[B, H, T, hd]`` per layer."""
    import importlib

    mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    seen, rotate = [], mod.apply_rotary_pos_emb

    def record(q, k, *args, **kwargs):
        seen.append((q.detach().clone(), k.detach().clone()))
        return rotate(q, k, *args, **kwargs)

    monkeypatch.setattr(mod, "apply_rotary_pos_emb", record)
    return seen


@pytest.mark.parametrize("model_type, clip", [("olmo", 0.05), ("olmo", None), ("olmo2", None), ("olmo3", None)])
def test_olmo_queries_and_keys_are_those_the_model_rotates(monkeypatch, model_type, clip):
    """split_qk of the registry's q/k modules gives exactly the q and k the model rotates: OLMo's projections
    clamped to ±clip_qkv (Groeneveld et al. 2024; hooks copy the output, so the clip must come from the
    registry), OLMo 2/3's whole-projection q_norm/k_norm outputs (Team OLMo 2024)."""
    from outlierlab.models.families import family_of
    from outlierlab.models.family_spec import split_qk

    model, tok = build(model_type, **({"clip_qkv": clip} if model_type == "olmo" else {}))
    projections = family_of(model).qk_projections(model)
    blocks = model.model.layers
    for p, b in zip(projections, blocks):
        if model_type == "olmo":
            assert (p.q, p.k, p.layout, p.clip) == (b.self_attn.q_proj, b.self_attn.k_proj, "separate", clip)
        else:
            assert (p.q, p.k, p.layout, p.clip) == (b.self_attn.q_norm, b.self_attn.k_norm, "separate", None)
    out, handles = {}, []
    for i, p in enumerate(projections):
        for name, m in (("q", p.q), ("k", p.k)):
            handles.append(m.register_forward_hook(
                lambda _m, _a, o, key=(i, name): out.__setitem__(key, o.detach().clone())))
    seen = _rotated(monkeypatch, model_type)
    ids = tok(["the captain read the letter again", "a lady"], padding=True, return_tensors="pt")
    with torch.no_grad():
        model(**ids)
    for h in handles:
        h.remove()
    assert len(seen) == len(projections) == 2
    for i, (p, (q_rot, k_rot)) in enumerate(zip(projections, seen)):
        q, k = split_qk(p, out[(i, "q")], out[(i, "k")])
        assert torch.equal(q, q_rot.transpose(1, 2)) and torch.equal(k, k_rot.transpose(1, 2))
        if clip is not None:  # the clip was active: without it the hooked projections are not what is rotated
            assert out[(i, "q")].abs().max() > 2 * clip and q.abs().max() == pytest.approx(clip)
            q_raw, _ = split_qk(p._replace(clip=None), out[(i, "q")], out[(i, "k")])
            assert not torch.equal(q_raw, q_rot.transpose(1, 2))


@pytest.mark.parametrize("model_type", ["olmo", "olmo2", "olmo3"])
def test_olmo_rotary_layers_and_sites(model_type):
    """Per layer the model's own θ_i and reach (OLMo 3: a 16-token sliding window, then a full layer with its own
    frequencies); Bondarenko et al.'s sites: the FFN down-projection and the block output (no norm on the
    stream inside an OLMo block), the latter equal to the hidden state the model hands on."""
    from outlierlab.models.hook_points import site_table
    from outlierlab.models.rotary_layers import rotary_layers
    from outlierlab.models.sites import InfNormRecorder, monitor_sites

    model, tok = build(model_type)
    rot = model.model.rotary_emb
    layers = rotary_layers(model)
    if model_type == "olmo3":
        assert [r.context for r in layers] == [16, 512]
        for r, kind in zip(layers, ("sliding_attention", "full_attention")):
            assert torch.equal(r.inv_freq, getattr(rot, f"{kind}_inv_freq").double())
            assert r.source == f"model.rotary_emb.{kind}_inv_freq"
    else:
        assert [r.context for r in layers] == [512, 512]
        assert all(torch.equal(r.inv_freq, rot.inv_freq.double()) for r in layers)
    table = site_table(model)
    for i, b in enumerate(model.model.layers, start=1):
        sites = {key: (table[name].module, table[name].where) for (key, layer), name in monitor_sites(model).items()
                 if layer == i}
        assert sites == {"ffn_output": (b.mlp.down_proj, "output"), "ln_input": (b, "output"),
                         "residual": (b, "output")}
    ids = tok(["the captain read the letter again", "a lady"], padding=True, return_tensors="pt")
    mask = ids["attention_mask"].bool()
    with InfNormRecorder(model) as rec, torch.no_grad():
        hidden = model(**ids, output_hidden_states=True).hidden_states
        rec.commit(mask)
    got = rec.result()
    assert float(got["ln_input"][1]) == pytest.approx(float(hidden[1][mask].abs().max()))


@pytest.mark.parametrize("model_type", ["olmo", "olmo2"])
def test_olmo_analyses_name_the_family(tmp_path, compose_cfg, model_type):
    """evaluate.py on a saved OLMo: the outliers analysis names the family (not 'not in the registry'), records
    the inf-norm sites, and judges the norms — OLMo's non-parametric ones: cannot be judged; OLMo 2's planted
    gain dim: found; qk_outliers reads q/k with their rotary frequencies."""
    import csv

    import evaluate as evaluate_script

    from outlierlab.models.layernorms import model_layernorms

    model, tok = build(model_type)
    plant(_per_layer(model_layernorms(model)), PLANTED)
    path = save(model, tok, tmp_path / model_type)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"The {w} sat by the window and read a letter." for w in
                              ("captain", "lady", "admiral", "sister", "friend", "cousin") * 4) + "\n")
    cfg = compose_cfg("evaluate", [f"encoder.name_or_path={path}", "progress=false", "tensorboard=false",
                                   "analyses=[outliers,qk_outliers]", f"data.files=[{text}]", "transform=[none]"])
    out = evaluate_script.evaluate(cfg, tmp_path / "run")
    report = (tmp_path / "run" / "report.md").read_text()
    assert "not in the model-family registry" not in report and f"Model family: {model_type} family" in report
    res = {r.name: r for r in out["results"]}
    assert res["outliers"].summary["family"] == model_type
    if model_type == "olmo":
        assert res["outliers"].summary["layernorm_outlier_dims"] == []
        assert "cannot judge (4 norms (layer.0.attention_input … layer.1.mlp_input): no gain and no bias" in report
    else:
        assert res["outliers"].summary["layernorm_outlier_dims"] == [PLANTED]
        assert "reordered norm: the norms on the attention's and the MLP's outputs" in report
    with open(tmp_path / "run" / "outliers.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["transform"] == "none" and r["layer"] in ("1", "2")]
    assert len(rows) == 2 and all(float(r["inf_norm_ffn_output"]) > 0 and float(r["inf_norm_ln_input"]) > 0
                                  for r in rows)
    qk = res["qk_outliers"]
    assert qk.summary["rotary"] is True and "inv_freq" in qk.markdown
    read = ["layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj"] if model_type == "olmo" else \
        ["layers.0.self_attn.q_norm", "layers.0.self_attn.k_norm"]
    assert qk.summary["qk_read_at"] == read


PRESETS = {"modernbert_base": "modernbert", "gpt2": "gpt2", "pythia_160m": "gpt_neox", "qwen2_0_5b": "qwen2",
           "tinyllama_1_1b": "llama", "olmo_1b": "olmo"}


@pytest.fixture
def family_hub(tmp_path, monkeypatch):
    """A Hugging Face hub cache (``models--<id>/refs/main`` + ``snapshots/<sha>/``, as the hub client writes it)
    holding a tiny stand-in of each preset's family under the preset's real hub id."""
    import huggingface_hub.constants

    from conftest import compose

    sha = "0123456789abcdef0123456789abcdef01234567"
    cache = tmp_path / "hf_hub_cache"
    repos = {}
    for preset, model_type in PRESETS.items():
        repo = str(compose("probe", [f"encoder={preset}"]).encoder.name_or_path)
        model, tok = build(model_type)
        save(model, tok, cache / f"models--{repo.replace('/', '--')}" / "snapshots" / sha)
        (cache / f"models--{repo.replace('/', '--')}" / "refs").mkdir()
        (cache / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text(sha)
        repos[preset] = repo
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return repos


def test_presets_load_through_the_hub_path_and_name_their_family(family_hub, tmp_path):
    """encoder=<preset> resolves its real hub id through the hub branch (offline, from the cache), and
    probe.py's report names the family and the norms the rule judges."""
    from conftest import compose

    from outlierlab.evaluation.probing import run
    from outlierlab.models.loading import FrozenEncoder

    for preset, repo in family_hub.items():
        enc = FrozenEncoder(repo, max_length=32, device="cpu")
        assert (enc.source.kind, enc.identity["hub"]) == ("hf", repo)
        family = "llama-style" if PRESETS[preset] in ("qwen2", "llama") else PRESETS[preset]
        assert enc.family_line().startswith(f"{family} family")
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(f"The {w} sat by the window and read the letter again." for w in
                              ("captain", "lady", "admiral", "sister", "friend", "cousin", "doctor", "widow") * 4))
    cfg = compose("probe", ["encoder=gpt2", "probe.epochs=1", "progress=false", f"data.files=[{text}]",
                            f"features.cache_dir={tmp_path / 'features'}", "transform=[none,clip]"])
    out = run(cfg, str(tmp_path / "probe"))
    report = (tmp_path / "probe" / "position_probe_report.md")
    report = report if report.is_file() else next((tmp_path / "probe").glob("*report*.md"))
    text = report.read_text()
    assert "- family: gpt2 family: decoder" in text and "`transformer.h.0.ln_1`" not in text
    assert "judged: 4 norms, `h.0.ln_1`, `h.0.ln_2`" in text and "clip zeroes the ACTIVATION outlier dims" in text
    assert out["info"]["family"].startswith("gpt2 family")


def test_frequency_reads_the_model_own_lm_head(tmp_path):
    """A decoder whose LM-head weight on dim 5 is each token's count in the text: ρ(frequency, W_out[:, 5]) = 1,
    named with the head's objective; a dim with random head weights is far from it."""
    from ablation_fixtures import make_ctx

    from outlierlab.evaluation.analyses.frequency import run
    from outlierlab.models.loading import FrozenEncoder

    lines = [f"The {w} walked into the {p} and sat down near the fire." for w in ("captain", "lady", "admiral")
             for p in ("room", "hall", "garden", "house")] * 2
    model, tok = build("gpt2", tie_word_embeddings=False)
    counts = torch.zeros(tok.vocab_size)
    for ids in tok(lines, add_special_tokens=False)["input_ids"]:
        counts += torch.bincount(torch.tensor(ids), minlength=tok.vocab_size).float()
    with torch.no_grad():
        model.lm_head.weight[:, 5] = counts
    enc = FrozenEncoder(str(save(model, tok, tmp_path / "gpt2")), device="cpu")
    res = run(make_ctx("frequency", enc, tmp_path, {"dims": [5, 7], "counts_from": "eval"}, text_lines=lines))
    by_dim = {r["dim"]: r for r in res.rows if r["layer"] == 0}
    assert by_dim[5]["head_spearman"] == pytest.approx(1.0) and abs(by_dim[7]["head_spearman"]) < 0.9
    assert {r["objective"] for r in res.rows} == {"next_token"} and "LM head (next-token" in res.markdown


def test_every_norm_kind_of_the_registry_can_be_named_in_a_layernorms_setting():
    """ablation/attention_sinks `layernorms=[...]` accepts every per-layer kind a family declares (OLMo 2's
    reordered kinds were refused by the settings check)."""
    from outlierlab.configuration.analysis_settings import LAYERNORM_KINDS
    from outlierlab.models.family_spec import POST_KINDS, PRE_KINDS, REORDERED_KINDS

    assert set(POST_KINDS + PRE_KINDS + REORDERED_KINDS) <= set(LAYERNORM_KINDS)


@pytest.mark.parametrize("model_type,roles", [
    ("olmo2", "both per-layer norms (on the attention's and the MLP's output, before each residual add)"),
    ("llama", "both per-layer norms (before the attention and before the MLP)"),
    ("bert", "each layer's output LayerNorm (after the FFN's residual add)")])
def test_the_family_line_says_which_norms_the_output_role_judges(tmp_path, model_type, roles):
    from family_models import build, save

    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder(str(save(*build(model_type), tmp_path / model_type)), device="cpu")
    line = enc.family_line()
    assert "\n" not in line and line.endswith(f"role judges {roles}."), line

