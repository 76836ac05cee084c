"""The built-in analyses of ``evaluate.py`` and ``outlierlab.api.evaluate``, one module each.

``analyses=[outliers,wic]`` names modules of this package (``outlierlab.evaluation.registry.ANALYSIS_MODULES``).
Each is an ordinary subscriber of the engine in ``outlierlab.evaluation`` -- a ``run(ctx)``, optionally
``check(ctx)`` and ``consumers(ctx)`` -- written exactly as an analysis of one's own would be (docs/extending.md),
which is selected by its dotted module path instead; the formulas they apply are pure functions in
``outlierlab.metrics``.  Besides the analyses, the helpers some of them share: the LayerNorm rule
(``ln_rule``) and what WiC and STS keep on disk (``layer_rows``, ``wic_targets``).

Kept free of heavy imports: ``evaluate.py`` validates analysis names against the registry before torch loads, and
imports a module here only once it is selected.
"""
