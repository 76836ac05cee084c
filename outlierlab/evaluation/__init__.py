"""The evaluation engine: one run over a frozen encoder (``core``), what a run gives each analysis and which analyses
exist (``registry``), and the per-layer stream the analyses subscribe to (``sentence_stream``) with the shared sentence
pass on it (``sentence_pass``); their typed settings are ``outlierlab.configuration.analysis_settings``.  The built-in
analyses plug into it from ``outlierlab.evaluation.analyses``.

Kept free of heavy imports: ``evaluate.py`` validates analysis names against the registry before torch loads.
"""
