"""Named sites (outlierlab.site_runs / scored_runs, outlierlab.models.hook_points / interventions / activation_cache):
every family's hidden states through the sites, hooks that change nothing and hooks that do, the dimension ablation
through the same hooks, activation patching, caches on disk within a memory budget, one-line errors."""

from __future__ import annotations

import os

import pytest
import torch

import outlierlab as ol
from cache_fixtures import CACHE_SITES, cache_corpus, ours
from family_models import DECODERS, SPECS, build
from probe_fixtures import SENTENCES
from outlierlab.models.hook_points import hidden_state_sites, norm_site, site_table
from outlierlab.models.interventions import clip, mean, patch, quantize, scale, zero

REGISTERED = [t for t in SPECS if t != "albert"]
OURS = ("ours-post", "ours-pre", "ours-op")
TEXTS = SENTENCES[:5]  # 5 texts of different lengths: batches of 2 are padded


def model_of(kind: str):
    return ours(kind.split("-")[1]) if kind in OURS else build(kind)


def hidden_states(model, tok, text: str) -> tuple:
    """The model's own ``output_hidden_states`` for one text (no padding), in its own attention implementation."""
    from outlierlab.models.family_spec import base_model

    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        if hasattr(model, "named_layernorms"):
            return model.roberta(enc["input_ids"], enc["attention_mask"], output_hidden_states=True).hidden_states
        return base_model(model)(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                 output_hidden_states=True).hidden_states


# ----------------------------------------------------------------------------------- every family's sites
@pytest.mark.parametrize("kind", [*REGISTERED, *OURS])
def test_cached_hidden_states_equal_output_hidden_states_and_an_identity_hook_changes_no_bit(kind):
    model, tok = model_of(kind)
    names = hidden_state_sites(model)
    assert len(names) == 1 + sum(n.endswith(".resid") for n in site_table(model))
    cache = ol.run_with_cache(model, TEXTS, sites=names, tokenizer=tok, batch_size=2)
    assert list(cache) == names and cache.n_tokens == int(cache.lengths.sum())
    for i, text in enumerate(TEXTS):
        reference = hidden_states(model, tok, text)
        assert len(reference) == len(names)
        for layer, name in enumerate(names):
            torch.testing.assert_close(cache.text(i, name), reference[layer][0], atol=1e-5, rtol=0,
                                       msg=f"{kind} {name} (hidden state {layer}), text {i}")
    # the same values whatever the batch: padding reaches no real token's row
    alone = ol.run_with_cache(model, TEXTS, sites=names[-1:], tokenizer=tok, batch_size=1)
    torch.testing.assert_close(alone[names[-1]], cache[names[-1]], atol=1e-5, rtol=0)

    table = site_table(model)
    writable = [n for n, s in table.items() if s.writable and s.layout == "tokens"]
    assert {"blocks.1.attn.in", "blocks.1.attn.z", "blocks.1.ffn.in", "blocks.1.ffn.post"} <= set(writable)
    base = ol.run_with_hooks(model, TEXTS, tokenizer=tok, keep_logits=True, batch_size=2)
    # a new tensor equal to the old at every site: through every path a hook takes (module inputs and outputs,
    # tuple outputs, slices of fused q/k/v projections written back)
    same = ol.run_with_hooks(model, TEXTS, hooks={n: (lambda x, p: x.clone()) for n in writable}, tokenizer=tok,
                             keep_logits=True, batch_size=2)
    assert base.n_scored > 0 and torch.equal(same.logits, base.logits)
    assert same.tokens.loss.tolist() == base.tokens.loss.tolist() and same.loss == base.loss
    assert base.objective == ("next_token" if kind in DECODERS else "masked_lm")
    # ... and a hook that changes something reaches the output
    doubled = ol.run_with_hooks(model, TEXTS, hooks={names[1]: scale(2.0)}, tokenizer=tok, keep_logits=True,
                                batch_size=2)
    assert not torch.equal(doubled.logits, base.logits)


@pytest.mark.parametrize("kind", [*REGISTERED, *OURS])
def test_the_input_sites_hold_what_each_linear_layer_and_the_ffn_norm_receive(kind):
    """``attn.in``, ``attn.z``, ``ffn.in``, ``ffn.post`` and ``ln_ffn.in`` cached equal, to the bit, the first input a
    plain forward pre-hook on each of the site's modules sees (every q/k/v projection, a gated FFN's gate and up
    projections); together they feed every linear layer of the blocks."""
    from outlierlab.models.hook_points import LINEAR_INPUT_SITES
    from outlierlab.models.w8a8 import linear_layers

    model, tok = model_of(kind)
    table = site_table(model)
    names = [n for n in table if n.split(".", 2)[-1] in (*LINEAR_INPUT_SITES, "ln_ffn.in")]
    assert {id(m) for n in names if not n.endswith("ln_ffn.in") for m in (table[n].module, *table[n].also)} == \
        {id(m) for m in linear_layers(model).values()}
    seen, handles = {}, []

    def record(key):
        def pre(_m, args, kwargs):
            seen[key] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return pre

    for name in names:
        for j, module in enumerate((table[name].module, *table[name].also)):
            handles.append(module.register_forward_pre_hook(record((name, j)), with_kwargs=True))
    try:
        cache = ol.run_with_cache(model, TEXTS[:1], sites=names, tokenizer=tok)
    finally:
        for h in handles:
            h.remove()
    assert sum(n.endswith(".attn.in") for n in names) == 2 and all(f"blocks.1.{s}" in names for s in LINEAR_INPUT_SITES)
    for (name, _), x in seen.items():
        torch.testing.assert_close(cache.text(0, name), x.reshape(-1, x.shape[-1]), atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("kind", ["bert", "modernbert", "gpt2", "llama", "olmo2", *OURS])
def test_every_site_has_the_shape_its_name_promises(kind):
    model, tok = model_of(kind)
    table = site_table(model)
    from outlierlab.models.families import family_of

    proj = family_of(model).qk_projections(model)[0]
    h, widths = proj.num_heads, {"attn.q": proj.num_heads * proj.head_dim, "attn.k": proj.num_kv_heads * proj.head_dim,
                                 "attn.v": proj.num_kv_heads * proj.head_dim}
    d = model.config.hidden_size
    cache = ol.run_with_cache(model, TEXTS[:2], sites=list(table), tokenizer=tok)
    n, t_max = cache.n_tokens, int(cache.lengths.max())
    heads = table["blocks.1.attn.pattern"]
    for name in table:
        x = cache[name]
        suffix = name.split(".", 2)[-1]
        if suffix in widths:
            assert x.shape == (n, widths[suffix]), name
        elif suffix == "attn.pattern":
            assert x.shape == (n, h, t_max), name
            text = cache.text(0, name)  # [H, n0, n0]: rows of probabilities over the text's keys
            torch.testing.assert_close(text.sum(-1), torch.ones(text.shape[:2]), atol=1e-5, rtol=0)
        elif suffix in ("ffn.pre", "ffn.post"):
            assert x.shape[0] == n and x.ndim == 2 and x.shape[1] > d, name
        else:
            assert x.shape == (n, d), name
    assert heads.layout == "pattern"
    # a post-LN block's FFN norm is its output; a pre-LN block's stream goes on without a norm
    if "ln_final" not in table and "blocks.2.ln_ffn" in table:
        torch.testing.assert_close(cache["blocks.2.ln_ffn"], cache["blocks.2.resid"], atol=0, rtol=0)


@pytest.mark.parametrize("model_type", ["gpt2", "gpt_neox", "modernbert", "llama"])
def test_fused_q_k_v_sites_are_the_projections_the_registry_splits(model_type):
    """q and k read from a fused projection (GPT-2 [q|k|v], GPT-NeoX per head [q_h|k_h|v_h], ModernBERT) equal
    family_spec.split_qk's reading of the same output; a hook zeroing k leaves q as it was."""
    from outlierlab.models.families import family_of
    from outlierlab.models.family_spec import split_qk

    model, tok = build(model_type)
    proj = family_of(model).qk_projections(model)[0]
    got = {}
    handles = [proj.q.register_forward_hook(lambda m, a, out: got.__setitem__("q", out.detach().clone()))]
    if proj.k is not proj.q:
        handles.append(proj.k.register_forward_hook(lambda m, a, out: got.__setitem__("k", out.detach().clone())))
    cache = ol.run_with_cache(model, TEXTS[:1], sites=["blocks.1.attn.q", "blocks.1.attn.k"], tokenizer=tok)
    for h in handles:
        h.remove()
    q, k = split_qk(proj, got["q"], got.get("k"))
    torch.testing.assert_close(cache["blocks.1.attn.q"], q[0].reshape(q.shape[1], -1), atol=0, rtol=0)
    torch.testing.assert_close(cache["blocks.1.attn.k"], k[0].reshape(k.shape[1], -1), atol=0, rtol=0)
    hooked = ol.run_with_hooks(model, TEXTS[:1], hooks={"blocks.1.attn.k": zero()}, cache=["blocks.1.attn.q",
                                                                                          "blocks.1.attn.k"],
                               tokenizer=tok)
    assert torch.count_nonzero(hooked.cache["blocks.1.attn.k"]) == 0  # the cache holds what flows on
    plain = ol.run_with_hooks(model, TEXTS[:1], cache=["blocks.1.attn.q"], tokenizer=tok)
    torch.testing.assert_close(hooked.cache["blocks.1.attn.q"], plain.cache["blocks.1.attn.q"], atol=0, rtol=0)


def test_our_attention_pattern_can_be_replaced_a_hugging_face_one_only_read():
    model, tok = ours("post")
    read = ol.run_with_hooks(model, TEXTS, hooks={"blocks.1.attn.pattern": lambda x, p: None}, tokenizer=tok,
                             keep_logits=True)
    same = ol.run_with_hooks(model, TEXTS, hooks={"blocks.1.attn.pattern": lambda x, p: x.clone()}, tokenizer=tok,
                             keep_logits=True)
    uniform = ol.run_with_hooks(model, TEXTS, hooks={"blocks.1.attn.pattern": lambda x, p: torch.where(
        x > 0, 1.0, 0.0) / (x > 0).sum(-1, keepdim=True)}, tokenizer=tok, keep_logits=True)
    assert torch.equal(read.logits, same.logits) and not torch.equal(read.logits, uniform.logits)
    bert, btok = build("bert")
    with pytest.raises(ValueError, match=r"^blocks\.1\.attn\.pattern can be read, not replaced") as e:
        ol.run_with_hooks(bert, TEXTS, hooks={"blocks.1.attn.pattern": lambda x, p: x * 1.0}, tokenizer=btok)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------- the interventions
class _Point:
    name, layout = "blocks.1.resid", "tokens"


def test_interventions_change_exactly_the_chosen_dims_and_positions():
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4) - 10
    p = _Point()
    expected = x.clone()
    for position in (0, 2):
        expected[:, position, [1, 3]] = 0
    assert torch.equal(zero([1, 3], positions=[0, 2])(x, p), expected)
    assert torch.equal(zero()(x, p), torch.zeros_like(x))
    m = mean(torch.tensor([100.0, 200.0, 300.0, 400.0]), dims=[2])(x, p)
    assert torch.equal(m[..., 2], torch.full((2, 3), 300.0)) and torch.equal(m[..., [0, 1, 3]], x[..., [0, 1, 3]])
    assert torch.equal(clip(5.0)(x, p), x.clamp(-5, 5))
    assert torch.equal(clip(low=0.0, dims=[0])(x, p)[..., 0], x[..., 0].clamp(min=0))
    assert torch.equal(scale(-2.0, dims=[3])(x, p)[..., 3], -2 * x[..., 3])
    from outlierlab.metrics.fake_quant import fake_quantize

    y = torch.randn(2, 3, 8)
    y[..., 5] = 40.0
    assert torch.equal(quantize(8)(y, p), fake_quantize(y, 8))
    kept = quantize(8, keep=[5])(y, p)
    assert torch.equal(kept[..., 5], y[..., 5]) and torch.equal(kept, fake_quantize(y, 8, torch.tensor([5])))
    with pytest.raises(ValueError, match=r"^dims \[4\] out of range for blocks\.1\.resid of size 4$"):
        zero([4])(x, p)


# ------------------------------------------------------------------------------- the ablation through hooks
def planted(seed: int = 0):
    """Ours with dim 7 of every output LayerNorm huge (the ablation tests' planted outlier)."""
    from ablation_fixtures import PLANTED_DIM, tiny_mlm

    model, tok = tiny_mlm(layers=2, seed=seed)
    return model, tok, PLANTED_DIM


@pytest.mark.parametrize("kind", ["ours", "roberta", "gpt2"])
def test_zero_ablation_through_run_with_hooks_equals_the_ablation_analysis_on_the_same_masks(kind):
    """The ablation's rows (now through the norms' sites) against run_with_hooks with zero() at those sites, on
    the ablation's masks -- and against the weight surgery the ablation used before (Kovaleva et al.'s zeroed gain
    and bias), to the bit: the default numbers did not move."""
    from outlierlab.evaluation.analyses.ablation import run_ablation
    from outlierlab.metrics.scored_rows import mlm_scores
    from outlierlab.datamodules.scoring_batches import masked_batches, next_token_batches
    from outlierlab.site_runs import as_loaded
    from outlierlab.models.layernorms import select_layernorms, zero_layernorm_dims

    if kind == "ours":
        model, tok, dim = planted()
    else:
        (model, tok), dim = build(kind), 7
    loaded = as_loaded(model, tok)
    texts = SENTENCES * 2
    seed, p, length, size = 5, 0.3, 64, 4
    batches = (next_token_batches(tok, texts, length, size) if loaded.objective == "next_token"
               else masked_batches(tok, texts, length, size, p, seed))
    kinds = ["output", "final"] if loaded.objective == "next_token" else ["output"]
    out = run_ablation(loaded, batches, kinds, [dim], [3, 4], n_random=2, seed=seed, top_k=3)
    by = {r["condition"]: r for r in out.rows}
    assert {r["mode"] for r in out.rows} == {"zero"}
    norms = select_layernorms(loaded.layernorms, kinds)
    sites = [norm_site(k) for k in norms]
    assert sites and all(s.startswith(("blocks.", "ln_final")) for s in sites)
    scoring = dict(tokenizer=None, seed=seed, mlm_probability=p, max_length=length, batch_size=size)
    intact = ol.run_with_hooks(loaded, texts, **scoring)
    zeroed = ol.run_with_hooks(loaded, texts, hooks={s: zero([dim]) for s in sites}, **scoring)
    user = ol.run_with_hooks(loaded, texts, hooks={s: zero([3, 4]) for s in sites}, **scoring)
    assert intact.loss == by["intact"]["loss"] and intact.n_scored == by["intact"]["n_masked"]
    assert zeroed.loss == by["outliers"]["loss"] and zeroed.top1 == by["outliers"]["top1"]
    assert user.loss == by["user"]["loss"] and zeroed.loss != intact.loss

    def surgery(dims):
        with zero_layernorm_dims(norms, dims):
            return mlm_scores(lambda i, a, rows: loaded.forward(i, a, rows=rows).logits, batches, by_position=True)

    for condition, dims in (("outliers", [dim]), ("user", [3, 4])):
        s = surgery(dims)
        assert (s["loss"], s["top1"], s["n_masked"]) == (by[condition]["loss"], by[condition]["top1"],
                                                         by[condition]["n_masked"])
        rows = [r for r in out.by_position if r["condition"] == condition]
        assert [(r["loss"], r["top1"]) for r in rows] == [(v["loss"], v["top1"]) for v in s["by_position"].values()]


def test_mean_ablation_keeps_what_zeroing_destroys_and_equals_hooks_with_the_cached_means():
    """Sun et al. (2024): a massive dimension set to its mean changes the model little, set to zero much.  Planted here: a
    dimension of every output LayerNorm that is nearly constant and large (gain 0.05, bias 20), as Sun et al.'s
    massive activations are: zeroing it wrecks the model, its mean does not.  The ablation's mean mode equals
    run_with_hooks with mean() of a cache of the same scored inputs."""
    from ablation_fixtures import tiny_mlm

    from outlierlab.evaluation.analyses.ablation import run_ablation
    from outlierlab.datamodules.scoring_batches import masked_batches
    from outlierlab.site_runs import as_loaded
    from outlierlab.models.layernorms import select_layernorms

    model, tok = tiny_mlm(layers=2, plant=False)
    dim = 7
    with torch.no_grad():
        for key, norm in model.named_layernorms().items():
            if key.endswith(".output"):
                norm.weight[dim], norm.bias[dim] = 0.05, 20.0
    loaded = as_loaded(model, tok)
    texts, seed, size = SENTENCES * 2, 3, 4
    batches = masked_batches(tok, texts, 64, size, 0.3, seed)
    zero_rows = {r["condition"]: r for r in run_ablation(loaded, batches, ["output"], [dim], [], n_random=0,
                                                         seed=seed, top_k=3).rows}
    mean_out = run_ablation(loaded, batches, ["output"], [dim], [], n_random=2, seed=seed, top_k=3, mode="mean")
    mean_rows = {r["condition"]: r for r in mean_out.rows}
    assert {r["mode"] for r in mean_out.rows} == {"mean"}
    assert mean_rows["intact"]["loss"] == zero_rows["intact"]["loss"]
    intact = zero_rows["intact"]["loss"]
    zeroed = abs(zero_rows["outliers"]["loss"] - intact)
    assert zeroed > 0.3  # zeroed: another model (a random one relies on nothing: its loss may even fall)
    assert abs(mean_rows["outliers"]["loss"] - intact) < 0.2 * zeroed
    sites = [norm_site(k) for k in select_layernorms(loaded.layernorms, ["output"])]
    scoring = dict(seed=seed, mlm_probability=0.3, max_length=64, batch_size=size)
    cached = ol.run_with_hooks(loaded, texts, cache=sites, **scoring).cache  # the scored inputs, intact
    hooked = ol.run_with_hooks(loaded, texts, hooks={s: mean(cached, dims=[dim]) for s in sites}, **scoring)
    assert hooked.loss == pytest.approx(mean_rows["outliers"]["loss"], abs=1e-6)
    with pytest.raises(ValueError, match="ablation mode 'median': valid: zero, mean"):
        run_ablation(loaded, batches, ["output"], [dim], [], n_random=0, seed=seed, top_k=3, mode="median")


def test_the_ablation_analysis_takes_mode_mean_from_its_settings(tmp_path):
    from ablation_fixtures import make_ctx, save_planted

    from outlierlab.evaluation.analyses.ablation import run
    from outlierlab.configuration.analysis_settings import AblationSettings
    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder(str(save_planted(tmp_path / "model")), device="cpu")
    res = run(make_ctx("ablation", enc, tmp_path, {"n_random": 1, "max_length": 64, "batch_size": 8,
                                                   "example": None, "mode": "mean"}))
    assert {r["mode"] for r in res.rows} == {"mean"} and res.summary["mode"] == "mean"
    assert "set to their mean over the scored tokens in the intact model (Sun et al. 2024)" in res.markdown
    with pytest.raises(ValueError):
        AblationSettings(mode="median")


def test_the_ablation_table_says_a_set_was_set_to_its_mean(tmp_path, capsys):
    from outlierlab.studies.ablation_table import main

    header = "condition,draw,n_dims,dims,layernorms,layers,objective,loss,ppl,top1,loss_std,ppl_std,top1_std," \
             "n_draws,n_masked,mode\n"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ablation.csv").write_text(header + "intact,,0,,output,,masked_lm,5.0,1,0.5,,,,1,10,mean\n"
                                                 "outliers,,1,7,output,,masked_lm,5.1,1,0.5,,,,1,10,mean\n")
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[2].split(" | ")[2] == "7 (set to mean)"


# --------------------------------------------------------------------------------------------- patching
def test_patching_with_its_own_activations_changes_nothing_and_with_another_texts_does():
    from family_models import minilm_tokenizer

    model, tok = ours("post", tok=minilm_tokenizer())  # WordPiece: the words in another order, as many tokens
    texts = SENTENCES
    shuffled = [" ".join(reversed(t.split())) for t in texts]
    scoring = dict(tokenizer=tok, seed=1, mlm_probability=0.4, batch_size=3)
    names = [n for n, s in site_table(model).items() if s.layout == "tokens"]
    own = ol.patch_sites(model, texts, texts, **scoring)
    assert list(own.site) == names and own.site.is_unique  # one row per site, every site but the patterns
    assert (own.effect == 0).all() and (own.loss == own.loss_base).all() and (own.loss_source == own.loss_base).all()
    other = ol.patch_sites(model, texts, shuffled, **scoring)
    assert list(other.site) == names and (other.loss_base == own.loss_base).all()
    assert other.loss_source.iloc[0] != other.loss_base.iloc[0]
    # the whole stream patched anywhere (a post-LN block's norms write it) makes the rest of the run the source's:
    # one loss, the clean labels scored on the source's predictions
    # (the output norm's input too: the norm writes the stream from it)
    stream_sites = r"^(?:embed|ln_embed|ln_head|blocks\.\d\.(?:ln_attn|ln_ffn\.in|ln_ffn|resid))$"
    stream = other[other.site.str.contains(stream_sites)]
    assert len(stream) == 2 + 1 + 4 * 2 and stream.loss.nunique() == 1
    assert (stream.effect != 0).all() and (stream.share == stream.effect / (stream.loss_source - stream.loss_base)).all()
    parts = other[~other.index.isin(stream.index)]
    assert (parts.effect.abs() < stream.effect.abs().iloc[0]).all()  # one sublayer carries part of the change
    # the block-1 input patched: from there on the run IS the source run (its tokens, the same masks)
    src = ol.run_with_hooks(model, shuffled, cache=["embed"], masks_from=texts, keep_logits=True, **scoring)
    via = ol.run_with_hooks(model, texts, hooks={"embed": patch(src.cache)}, keep_logits=True, **scoring)
    assert torch.equal(via.logits, src.logits)
    assert via.tokens.position.tolist() == src.tokens.position.tolist()
    # per position: each site's rows add up to its row
    per = ol.patch_sites(model, texts, shuffled, sites=["embed", "blocks.2.resid"], by="position", **scoring)
    for site, g in per.groupby("site", sort=False):
        whole = other[other.site == site].iloc[0]
        assert g.n_scored.sum() == whole.n_scored
        assert (g.loss * g.n_scored).sum() / g.n_scored.sum() == pytest.approx(whole.loss, abs=1e-9)
    # only some dims: something of the source, not all of it; every dim: all of it
    embed = other[other.site == "embed"].loss.iloc[0]
    one_dim = ol.patch_sites(model, texts, shuffled, sites=["embed"], dims=[0], **scoring).loss.iloc[0]
    every = ol.patch_sites(model, texts, shuffled, sites=["embed"], dims=range(32), **scoring).loss.iloc[0]
    assert one_dim not in (embed, other.loss_base.iloc[0]) and every == embed


def test_patching_texts_of_different_lengths_is_one_line():
    model, tok = build("bert")
    with pytest.raises(ValueError, match=r"^masks_from: text 1 has \d+ tokens and its masks_from text \d+; ") as e:
        ol.patch_sites(model, SENTENCES[:2], [SENTENCES[0], SENTENCES[1] + " and more"], tokenizer=tok)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------- caches on disk
def _cache_peaks(folder) -> dict:
    """In a fresh process (one that has freed nothing yet: pages an earlier test freed but the allocator kept would
    hide what a cache costs): the peak resident memory of caching the test's corpus to disk, then in memory."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    code = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import outlierlab as ol
from cache_fixtures import CACHE_SITES, cache_corpus, peak_rss_mb, reset_peak
model, tok, texts = cache_corpus()
ol.run_with_cache(model, texts[:1], sites=CACHE_SITES, to={str(folder / "warm")!r}, tokenizer=tok)  # first kernels
start = reset_peak()
disk = ol.run_with_cache(model, texts, sites=CACHE_SITES, to={str(folder / "cache")!r}, tokenizer=tok, batch_size=4)
disk_peak = peak_rss_mb() - start
size = sum(disk[s].numel() * disk[s].element_size() for s in disk) / 2**20
del disk
start = reset_peak()
memory = ol.run_with_cache(model, texts, sites=CACHE_SITES, tokenizer=tok, batch_size=4)
print(json.dumps({{"disk": disk_peak, "memory": peak_rss_mb() - start, "size": size}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_disk_cache_larger_than_the_memory_budget_stays_under_it_and_reads_back_equal(tmp_path):
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident memory")
    budget_mb = 48  # a batch of 4 texts' activations is 17 MB: the budget leaves room for one in flight and the model
    peaks = _cache_peaks(tmp_path)
    assert peaks["size"] > 2 * budget_mb, peaks  # a corpus larger than the budget
    assert peaks["disk"] < budget_mb, peaks
    assert peaks["memory"] > budget_mb, peaks  # in memory it does not fit: the measure sees the difference
    model, tok, texts = cache_corpus()
    disk = ol.load_cache(tmp_path / "cache")
    memory = ol.run_with_cache(model, texts, sites=CACHE_SITES, tokenizer=tok, batch_size=8)
    assert list(disk) == list(memory) and len(disk) == 12
    for name in memory:
        assert torch.equal(disk[name], memory[name]), name
    for field in ("input_ids", "text_index", "positions", "lengths"):
        assert torch.equal(getattr(disk, field), getattr(memory, field)), field
    assert disk.texts == texts
    assert torch.equal(disk.mean("blocks.2.resid"), memory.mean("blocks.2.resid"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_cache_in_half_precision_reads_back_equal_from_disk(tmp_path, dtype):
    model, tok = build("llama")
    names = ["blocks.1.attn.pattern", "blocks.2.resid", "ln_final"]
    memory = ol.run_with_cache(model, TEXTS, sites=names, dtype=dtype, tokenizer=tok, batch_size=2)
    disk = ol.run_with_cache(model, TEXTS, sites=names, dtype=dtype, to=tmp_path / dtype, tokenizer=tok, batch_size=2)
    for name in names:
        assert disk[name].dtype == getattr(torch, dtype) and torch.equal(disk[name], memory[name]), name
    full = ol.run_with_cache(model, TEXTS, sites=names, tokenizer=tok, batch_size=2)
    assert torch.equal(memory["blocks.2.resid"], full["blocks.2.resid"].to(getattr(torch, dtype)))
    # the pattern per query token, keys past the text zero; as [H, n, n] per text
    n0 = int(full.lengths[0])
    assert torch.count_nonzero(full["blocks.1.attn.pattern"][:n0, :, n0:]) == 0
    assert full.text(0, "blocks.1.attn.pattern").shape[1:] == (n0, n0)
    tokens = full.frame(tok)
    assert len(tokens) == full.n_tokens and tokens.token.iloc[0] == tok.cls_token


# ------------------------------------------------------------------------------------------- bad input
def test_an_unknown_site_is_one_line_listing_the_valid_ones():
    model, tok = ours("pre")
    for call in (lambda: ol.run_with_cache(model, TEXTS, sites=["blocks.1.resd"], tokenizer=tok),
                 lambda: ol.run_with_hooks(model, TEXTS, hooks={"blocks.9.resid": zero()}, tokenizer=tok),
                 lambda: ol.patch_sites(model, TEXTS, TEXTS, sites=["resid"], tokenizer=tok)):
        with pytest.raises(ValueError) as e:
            call()
        message = str(e.value)
        assert "\n" not in message and message.startswith("unknown site '")
        assert message.endswith("; valid: embed, ln_embed, blocks.{1..2}.attn.in, blocks.{1..2}.attn.q, "
                                "blocks.{1..2}.attn.k, blocks.{1..2}.attn.v, blocks.{1..2}.attn.pattern, "
                                "blocks.{1..2}.attn.z, blocks.{1..2}.attn.out, blocks.{1..2}.ln_attn, "
                                "blocks.{1..2}.ffn.in, blocks.{1..2}.ffn.pre, blocks.{1..2}.ffn.post, "
                                "blocks.{1..2}.ffn.out, blocks.{1..2}.ln_ffn.in, blocks.{1..2}.ln_ffn, "
                                "blocks.{1..2}.resid, ln_final, ln_head")
    assert ol.sites(model, tokenizer=tok)[-2:] == ["ln_final", "ln_head"]
    # a glob that matches nothing is unknown too; one that matches picks in depth order
    with pytest.raises(ValueError, match=r"^unknown site 'blocks\.\*\.mlp'"):
        ol.run_with_cache(model, TEXTS, sites=["blocks.*.mlp"], tokenizer=tok)
    assert list(ol.run_with_cache(model, TEXTS, sites=["blocks.*.resid", "embed"], tokenizer=tok)) == [
        "embed", "blocks.1.resid", "blocks.2.resid"]


def test_other_bad_input_is_one_line(tmp_path):
    model, tok = ours("post")
    cases = [
        (lambda: ol.run_with_cache(model, TEXTS, sites="blocks.1.resid", tokenizer=tok), TypeError,
         "sites='blocks.1.resid' is a single string"),
        (lambda: ol.run_with_cache(model, TEXTS, tokenizer=tok, dtype="int8"), ValueError,
         "dtype='int8': the cache stores float32, float16 or bfloat16"),
        (lambda: ol.run_with_cache(model, TEXTS), TypeError, "pass tokenizer="),
        (lambda: ol.run_with_cache("outputs/train/RUN", TEXTS), TypeError, "is a name: pass the loaded model"),
        (lambda: ol.run_with_cache(model, "one text", tokenizer=tok), TypeError, "texts is a single str"),
        (lambda: ol.run_with_hooks(model, TEXTS, hooks={"embed": 3}, tokenizer=tok), TypeError,
         "hooks['embed'] is not callable (int)"),
        (lambda: ol.run_with_hooks(model, TEXTS, hooks={"embed": lambda x, p: x[:, :1]}, tokenizer=tok), ValueError,
         "the hook at embed returned shape"),
        (lambda: ol.run_with_hooks(model.roberta, TEXTS, tokenizer=tok), ValueError, "has no LM head"),
        (lambda: ol.patch_sites(model, TEXTS, TEXTS[:2], tokenizer=tok), ValueError, "source has 2 texts"),
        (lambda: ol.patch_sites(model, TEXTS, TEXTS, by="token", tokenizer=tok), ValueError, "by='token'"),
        (lambda: ol.load_cache(tmp_path), FileNotFoundError, "holds no activation cache"),
    ]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    cases.append((lambda: ol.run_with_cache(model, TEXTS, to=tmp_path / "full", tokenizer=tok), FileExistsError,
                  "exists and is not an empty directory"))
    for call, error, words in cases:
        with pytest.raises(error) as e:
            call()
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_names_are_exported_lazily():
    import subprocess
    import sys

    code = ("import sys, outlierlab as ol; assert 'torch' not in sys.modules; "
            "names = ['sites', 'run_with_cache', 'run_with_hooks', 'patch_sites', 'interventions', 'load_cache']; "
            "assert set(names) <= set(dir(ol)); assert callable(ol.interventions.zero); "
            "assert all(callable(getattr(ol, n)) for n in names if n != 'interventions')")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


# ------------------------------------------------------------------------------------------------ the page
def test_the_sites_page_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/sites.md's Python blocks, in order, in one namespace, offline: the bundled all-MiniLM-L6-v2, then a
    train.py run directory (here a small one of ours with a monitor history, where `python train.py` leaves its
    run)."""
    import re
    import tempfile

    import pandas as pd
    from probe_fixtures import save_own_run

    from conftest import ROOT

    run = tmp_path / "outputs" / "train" / "learned" / "2026-01-01_00-00-00"
    save_own_run(run, pos="learned")
    (run / "finished.json").write_text("{}")
    (run / "monitor").mkdir()
    pd.DataFrame([{"step": s, "name": f"layer_{i}", "statistic": "abs_argmax_share", "dim": 5 + i,
                   "value": 0.1 * i + s / 1000} for s in (50, 100) for i in range(3)]).to_csv(
        run / "monitor" / "hidden_states.csv", index=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # to="disk": its temporary directory under tmp_path
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "sites.md").read_text(), re.S)
    assert len(blocks) == 6
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/sites.md python block {i + 1}", "exec"), namespace)
    assert (namespace["layer"], namespace["dim"], namespace["site"]) == (2, 7, "blocks.2.resid")
    assert namespace["cache"].path.parent == tmp_path and namespace["by_position"].position.is_monotonic_increasing
    assert len(namespace["clean_texts"]) > 200  # most shuffled sentences keep their token count
    printed = capsys.readouterr().out
    assert "loss " in printed and "; set to its mean " in printed
