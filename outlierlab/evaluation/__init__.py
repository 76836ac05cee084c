"""The evaluation engine: one run over a frozen encoder (:mod:`~outlierlab.evaluation.core`), what a run gives each
analysis and which analyses exist (:mod:`~outlierlab.evaluation.registry`), their typed settings
(:mod:`~outlierlab.evaluation.settings`), and the per-layer stream the analyses subscribe to
(:mod:`~outlierlab.evaluation.sentence_stream`) with the shared sentence pass on it
(:mod:`~outlierlab.evaluation.sentence_pass`).  The built-in analyses plug into it from :mod:`outlierlab.analyses`.

Kept free of heavy imports: ``evaluate.py`` validates analysis names against the registry before torch loads.
"""
