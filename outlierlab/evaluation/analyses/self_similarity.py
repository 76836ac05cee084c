"""Self-similarity and intra-sentence similarity per layer (Ethayarajh 2019), before/after clip and whiten.

Words are regex words (``words.WORD_RE``, lower-cased by default) mapped to tokens by character offsets, a multi-token
word being the mean of its tokens.  Target words: types in ≥ ``self_similarity.min_sentences`` sentences (default 10), a
seeded sample of ``max_words`` (paper: 1000); only a word's first occurrence per sentence counts.

* self-similarity(w) = mean pairwise cosine of w's vectors across sentences, averaged over words, minus the same
  transform's anisotropy (``self_similarity``; ``self_similarity_raw`` before);
* intra-sentence similarity = mean cosine of each word to its sentence's mean word vector, averaged over sentences,
  minus anisotropy (``intra_sentence``; ``intra_sentence_raw``).
"""

from __future__ import annotations

from outlierlab.evaluation.analyses.anisotropy import reservoir, transform_lines
from outlierlab.evaluation.registry import AnalysisResult, EvalContext
from outlierlab.reports.evaluation_report import plot_layers
from outlierlab.utils.tables import md_table
from outlierlab.evaluation.sentence_pass import WordSimilarity, sentence_stats

#: asked of the shared pass's fit (outlierlab.evaluation.sentence_pass.PASS_NEEDS): every transform's map, for the
#: anisotropy subtracted (the reservoir is raw)
SENTENCE_PASS = frozenset({"fitted_maps"})


def consumers(ctx: EvalContext) -> list:
    """The anisotropy reservoir (each value is adjusted by the same transform's anisotropy) and one word-similarity
    subscriber per transform."""
    return [reservoir(ctx), *(WordSimilarity(t) for t in ctx.transforms)]


def run(ctx: EvalContext) -> AnalysisResult:
    st = sentence_stats(ctx)
    pairs, sims = ctx.consumers[0], dict(zip(ctx.transforms, ctx.consumers[1:]))
    min_occ = int(st.settings["min_sentences"])
    rows, series, per_word = [], {}, {}
    for t in ctx.transforms:
        aniso = pairs.anisotropy(st.transforms, t)
        acc = sims[t].result()
        keys, raw = acc.compute(min_occ)  # [L, K'] raw per word
        intra = sims[t].intra_sentence()
        counts = acc.counts
        n_occ = int(counts[counts >= max(2, min_occ)].sum())
        mean_raw = raw.mean(1)
        for layer in range(st.num_layers):
            rows.append({"layer": layer, "transform": t,
                         "self_similarity": float(mean_raw[layer] - aniso[layer]),
                         "self_similarity_raw": float(mean_raw[layer]),
                         "intra_sentence": float(intra[layer] - aniso[layer]),
                         "intra_sentence_raw": float(intra[layer]),
                         "anisotropy": float(aniso[layer]), "n_words": int(keys.numel()), "n_occurrences": n_occ,
                         "n_sentences": sims[t].intra_n})
        series[f"self-sim {t}"] = (mean_raw - aniso).tolist()
        series[f"intra-sent {t}"] = (intra - aniso).tolist()
        per_word[t] = (keys, raw)
    fig = plot_layers(ctx.out_dir / "self_similarity.png", series, "cosine − anisotropy",
                      "self-similarity and intra-sentence similarity (Ethayarajh 2019), anisotropy-adjusted"
                      ) if ctx.plots else None
    n_words = rows[0]["n_words"] if rows else 0
    md = ["## Self-similarity and intra-sentence similarity (Ethayarajh 2019)",
          f"{n_words} target words (occurring in ≥ {min_occ} of {st.n_sentences} sentences; cap "
          f"{st.settings['max_words']}, seeded sample; first occurrence per sentence), "
          f"{rows[0]['n_occurrences'] if rows else 0} occurrences. Words are regex words mapped to tokens by "
          "character offsets; **a word split into several subword tokens is the mean of its tokens' vectors**. "
          "Values are anisotropy-adjusted (cosine − the same transform's anisotropy); raw values in the CSV.",
          *transform_lines(st, ctx.transforms)]
    md.append(md_table(["layer", *(f"self-sim {t}" for t in ctx.transforms), *(f"intra {t}" for t in ctx.transforms)],
                       [[layer, *(r["self_similarity"] for r in rows if r["layer"] == layer),
                         *(r["intra_sentence"] for r in rows if r["layer"] == layer)]
                        for layer in range(st.num_layers)]))
    md.append("![self-similarity per layer](self_similarity.png)")
    if "none" in per_word and per_word["none"][0].numel():
        keys, raw = per_word["none"]
        last = raw[-1]
        order = last.argsort()
        lo = [st.words[int(keys[i])] for i in order[:5]]
        hi = [st.words[int(keys[i])] for i in order.flip(0)[:5]]
        md.append(f"Last layer, raw vectors — most context-specific words (lowest self-similarity): {', '.join(lo)}; "
                  f"least: {', '.join(hi)}.")
    summary = {"n_words": n_words, "min_sentences": min_occ,
               "mean_self_similarity": {t: sum(r["self_similarity"] for r in rows if r["transform"] == t)
                                        / st.num_layers for t in ctx.transforms}}
    return AnalysisResult("self_similarity", rows, "\n\n".join(md), [fig], summary)
