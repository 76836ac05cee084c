"""The formulas of docs/design.md as pure tensor functions: no config, no Lightning, no files of their own (a fit may
keep its per-layer maps in ``outlierlab.utils.disk_layers``).  The evaluate analyses
(``outlierlab.evaluation.analyses``), the monitors (``outlierlab.monitoring``), the probes and the studies apply
them; where an analysis needs formulas of its own, the module says which (``wic_thresholds`` for ``wic``,
``sts_scores`` for ``sts``, ``frequency_stats``, ``frequent_token_logits``, ``qk_magnitudes``, ``word_order``)."""
