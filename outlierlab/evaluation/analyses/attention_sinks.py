"""``evaluate.py`` analysis ``attention_sinks``: attention mass on ``<s>``/``[CLS]`` and ``</s>``/``[SEP]``.

Many BERT heads park their attention on special tokens (Kovaleva et al. 2019, "Revealing the Dark Secrets of BERT";
Clark et al. 2019); Kovaleva et al. (2021) and Puccetti et al. (2022) tie this to the LayerNorm outlier dims.  Per layer
and head: the mass real queries put on ``<s>`` and on ``</s>`` (``special_token_attention_mass``), intact, with the
LayerNorm outlier dims disabled (``zero_layernorm_dims``, as the ablation) and with as many random dims disabled.  Eager
attention probabilities.  Per layer the share of *sink heads* (mass on ``<s>``/``</s>`` above ε = 0.3) and each head's
attention entropy follow Gu et al. (2025, "When Attention Sink Emerges in Language Models").  Layer l = 1..L is the
attention inside block l.

Decoders: the ``<s>`` column is the FIRST token whatever its id (the initial-token sink, Xiao et al. 2024, "Efficient
Streaming Language Models with Attention Sinks"; Gu et al. 2025), and the ``later`` column checks the causal mask (0
when respected).  Early queries' entropies are bounded by their few visible keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

from outlierlab.metrics.attention_mass import SINK_KEYS as KEYS  # the columns of the rows below
from outlierlab.metrics.attention_mass import sink_head_share, sink_masses
from outlierlab.metrics.outlier_dims import random_dims
from outlierlab.evaluation.registry import AnalysisResult, EvalContext, scored_texts, shared_mlm, skip_result
from outlierlab.evaluation.analyses.ln_rule import check_common, detect_layernorm_outliers, zeroed_kinds
from outlierlab.models.layernorms import select_layernorms, zero_layernorm_dims
from outlierlab.configuration.analysis_settings import AttentionSinksSettings
from outlierlab.utils.atomic import save_figure
from outlierlab.utils.tables import md_table

#: Scores with the model's LM head: evaluate.py loads the encoder with it, once.
LM_HEAD = True

TITLE = "## Attention sinks: mass on special tokens (Kovaleva et al. 2019/2021)"


def text_batches(tokenizer, texts: Sequence[str], max_length: int, batch_size: int) -> list[tuple[Tensor, Tensor]]:
    """``(input_ids, attention_mask)`` padded batches of ``texts`` with special tokens, truncated."""
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token (and no eos token to pad with)")
    out = []
    for i in range(0, len(texts), batch_size):  # right padding: position 0 is every row's first real token
        enc = tokenizer(list(texts[i:i + batch_size]), truncation=True, max_length=max_length, padding=True,
                        padding_side="right", return_tensors="pt")
        out.append((enc["input_ids"], enc["attention_mask"]))
    return out


def sink_rows(by_condition: Mapping[str, Mapping[str, Tensor]], dims: Mapping[str, str] | None = None) -> list[dict]:
    """CSV rows ``layer`` (1-based), ``head``, ``condition``, ``bos``, ``eos``, ``special``, ``entropy`` (when
    measured), ``dims`` (``dims``: condition -> the disabled dims as text, e.g. ``"77;588"``)."""
    rows = []
    for cond, m in by_condition.items():
        L, H = m["bos"].shape
        for l in range(L):
            for h in range(H):
                rows.append({"layer": l + 1, "head": h, "condition": cond,
                             **{k: float(m[k][l, h]) for k in KEYS},
                             **({"entropy": float(m["entropy"][l, h])} if "entropy" in m else {}),
                             **({"later": float(m["later"][l, h])} if "later" in m else {}),
                             "dims": (dims or {}).get(cond, "")})
    return rows


def _heatmap(by_condition: Mapping[str, Mapping[str, Tensor]], path: Path, title: str) -> Path:
    conds = list(by_condition)
    L, H = by_condition[conds[0]]["bos"].shape
    panel_w, panel_h = max(3.0, 0.35 * H + 1.2), max(2.5, 0.3 * L + 1.2)
    fig = Figure(figsize=(panel_w * len(conds) + 1, 2 * panel_h), layout="constrained")
    axes = fig.subplots(2, len(conds), squeeze=False)
    for j, cond in enumerate(conds):
        for i, (key, label) in enumerate((("bos", "<s>/[CLS]"), ("eos", "</s>/[SEP]"))):
            ax = axes[i, j]
            im = ax.imshow(by_condition[cond][key].numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
            ax.set(xlabel="head", ylabel="layer", xticks=range(H), yticks=range(L), yticklabels=range(1, L + 1))
            ax.set_title(f"{cond}\nmass on {label}", fontsize=9)
            ax.tick_params(labelsize=7)
    fig.colorbar(im, ax=axes, shrink=0.6)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path, dpi=110)
    return path


def check(ctx: EvalContext):
    """Settings and files, before any encoding (called by evaluate.py); returns the outlier rule."""
    return check_common(ctx, ctx.settings(AttentionSinksSettings))


def run(ctx: EvalContext) -> AnalysisResult:
    """Attention mass on special tokens, intact vs outlier dims disabled (``configs/attention_sinks/default.yaml``)."""
    s = ctx.settings(AttentionSinksSettings)
    rule = check_common(ctx, s)
    loaded = shared_mlm(ctx)
    bos, eos, decoder = loaded.bos_token_id, loaded.eos_token_id, loaded.is_decoder
    if not decoder and (bos is None or eos is None):
        return skip_result("attention_sinks", TITLE, f"the tokenizer of {loaded.name} has no <s>/[CLS] or </s>/[SEP].")
    if loaded.family is None:  # unregistered model_type: no norms to disable, the intact pattern still comes out
        kinds, lns, given, dims, found = [], {}, None, [], loaded.family_note
    else:
        kinds = zeroed_kinds(s, rule, loaded.layernorms)
        lns = select_layernorms(loaded.layernorms, kinds)
        det = detect_layernorm_outliers(loaded.layernorms, rule)  # the one rule (configs/ln_rule)
        given = s.dims
        dims = list(given) if given else det.dims
        found = det.describe()
    texts, what, max_length, seed = scored_texts(ctx, s, loaded)
    batches = text_batches(loaded.tokenizer, texts, max_length, s.batch_size)

    def attentions(ids, mask):
        out = loaded.forward(ids, mask, output_attentions=True).attentions
        if not out or out[0] is None:
            raise ValueError(f"{loaded.name} returned no attention probabilities (needs eager attention)")
        return out

    results = {"intact": sink_masses(attentions, batches, bos, eos, decoder)}
    dims_text = {}
    n_random = s.n_random
    if dims:
        with zero_layernorm_dims(lns, dims):
            results["outliers_disabled"] = sink_masses(attentions, batches, bos, eos, decoder)
        dims_text["outliers_disabled"] = ";".join(map(str, dims))
        if n_random > 0:  # control: as many random dims (never the outlier dims), mean over the draws
            gen = torch.Generator().manual_seed(seed)
            draws = [random_dims(loaded.hidden_size, len(dims), exclude=dims, generator=gen) for _ in range(n_random)]
            per = []
            for ds in draws:
                with zero_layernorm_dims(lns, ds):
                    per.append(sink_masses(attentions, batches, bos, eos, decoder))
            results["random_disabled"] = {k: torch.stack([p[k] for p in per]).mean(0)
                                          for k in KEYS + ("entropy", "later")}
            dims_text["random_disabled"] = "|".join(";".join(map(str, ds)) for ds in draws)
    fig_path = Path(ctx.out_dir or "") / "attention_sinks.png"  # no run directory (in memory): plots are off
    fig = _heatmap(results, fig_path, f"{loaded.name}: attention mass on special tokens (mean over real queries)"
                   ) if ctx.plots else None

    md, summary = _report(results, s, decoder, what, dims, given, found, kinds, fig_path)
    return AnalysisResult("attention_sinks", sink_rows(results, dims_text), "\n".join(md), figures=[fig],
                          summary=summary)


def _report(results: dict, s, decoder: bool, what: str, dims, given, found: str, kinds, fig_path: Path
            ) -> tuple[list[str], dict]:
    """The report section (masses on ``<s>``/``</s>`` per layer, sink-head shares, entropy) and the summary."""
    n_random = s.n_random
    conds = list(results)
    first = ("Decoder: `<s>` is each sequence's FIRST token (the sink of a causal model, whatever its id). "
             if decoder else "")
    L = results["intact"]["bos"].shape[0]
    masses = [[l + 1, *(f"{float(results[c][k][l].mean()):.2f} ({float(results[c][k][l].max()):.2f})"
                        for c in conds for k in ("bos", "eos"))] for l in range(L)]
    md = [TITLE, "", first + "Mean over heads (max head in brackets) of the attention mass real queries put on "
          f"`<s>`/`[CLS]` and `</s>`/`[SEP]`; {what}.", "",
          md_table(["layer", *(f"{c}: {k}" for c in conds for k in ("<s>", "</s>"))], masses, cell=str)]
    leak = float(results["intact"]["later"].max())
    md += ["", (f"- Causal mask: the largest mean mass a head puts on later tokens is {leak:.2g} "
                + ("(respected)." if leak < 1e-6 else "— NOT 0: this decoder's attention sees the future.")
                if decoder else f"- Right-context mass (keys after the query), largest head: {leak:.2f}."),
           "- Outlier dims: " + (f"given by attention_sinks.dims: {dims}" if given else found)
           + f"; disabled (gain and bias zeroed) in: {', '.join(kinds) or 'no'} LayerNorms."
           + (f" Control `random_disabled`: as many random dims (never the outlier dims), mean over {n_random} "
              "seeded draw(s) (dims in the CSV)." if dims and n_random > 0 else ""),
           "", f"![attention mass on special tokens, layers × heads]({fig_path.name})", ""]
    if not dims:
        md.insert(-3, "- No outlier dim to disable: only the intact model is shown.")
    thr = s.sink_threshold
    shares = {c: {k: sink_head_share(results[c][k], thr) for k in ("bos", "eos")} for c in conds}
    sinks = [[l + 1, *(cell for c in conds for cell in (f"{100 * float(shares[c]['bos'][l]):.0f}%",
                                                          f"{100 * float(shares[c]['eos'][l]):.0f}%",
                                                          f"{float(results[c]['entropy'][l].mean()):.2f}"))]
             for l in range(L)]
    md += ["", f"Sink heads (Gu et al. 2025): share of a layer's heads whose mean attention on `<s>` (`</s>`) "
           f"exceeds {thr:g}, and the mean attention entropy over heads (nats).", "",
           md_table(["layer", *(f"{c}: {k}" for c in conds for k in ("<s> sinks", "</s> sinks", "entropy"))], sinks,
                    cell=str), ""]
    summary = {f"special_mass_{c}": float(results[c]["special"].mean()) for c in conds}
    summary["max_later_mass"] = leak
    for c in conds:
        summary[f"sink_share_bos_{c}"] = [float(v) for v in shares[c]["bos"]]
        summary[f"sink_share_eos_{c}"] = [float(v) for v in shares[c]["eos"]]
        summary[f"attn_entropy_{c}"] = [float(v) for v in results[c]["entropy"].mean(-1)]
    return md, summary
