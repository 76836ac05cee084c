"""The columns every evaluate.py table is written with, shared by the end-to-end run and the docs' table pages."""

COLUMNS = {
    "outliers.csv": ["layer", "transform", "n_tokens", "n_outlier_dims", "outlier_dims", "argmax_dim", "argmax_share",
                     "argmin_dim", "argmin_share", "top_dims", "top_mean_values", "top_argmax_share",
                     "top_argmin_share", "mean_norm", "kurtosis", "max_median", "max_abs", "max_abs_dim",
                     "max_abs_token", "abs_argmax_dim", "abs_argmax_share", "inf_norm_ffn_output",
                     "inf_norm_ln_input", "inf_norm_ln_output"],
    "anisotropy.csv": ["layer", "transform", "anisotropy", "n_pairs", "n_sentences", "rogue_dims", "rogue_cc",
                       "rogue_share", "top1_share", "top3_share", "top5_share", "r2_without_top1", "r2_without_top3",
                       "r2_without_top5", "spearman_without_top1", "spearman_without_top3", "spearman_without_top5"],
    "isotropy.csv": ["layer", "transform", "isoscore", "isoscore_star", "zeta", "dims", "n_tokens", "n_star_points"],
    "self_similarity.csv": ["layer", "transform", "self_similarity", "self_similarity_raw", "intra_sentence",
                            "intra_sentence_raw", "anisotropy", "n_words", "n_occurrences", "n_sentences"],
    "wic.csv": ["layer", "transform", *(f"acc_{t / 10:g}" for t in range(1, 10)), "best_threshold", "best_accuracy",
                "mean_cos_same", "mean_cos_diff", "n_pairs"],
    "sts.csv": ["layer", "transform", "dataset", "subset", "split", "spearman", "n_pairs"],
}
# every whitened row states what the whitener was fitted on (outlierlab.metrics.whitening.WhiteningFit.columns)
WHITEN = ["whiten_fit", "whiten_n", "whiten_distinct", "whiten_rank", "whiten_k", "whiten_degenerate"]
COLUMNS = {name: cols + WHITEN for name, cols in COLUMNS.items()}
