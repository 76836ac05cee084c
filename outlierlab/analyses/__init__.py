"""The built-in analyses of ``evaluate.py`` and ``outlierlab.api.evaluate``, one module each.

``analyses=[outliers,wic]`` names modules of this package (``outlierlab.evaluation.registry.ANALYSIS_MODULES``).
Each is an ordinary subscriber of the engine in ``outlierlab.evaluation`` -- a ``run(ctx)``, optionally
``check(ctx)`` and ``consumers(ctx)`` -- written exactly as an analysis of one's own would be (docs/extending.md);
the formulas they apply are pure functions in ``outlierlab.analysis``.

Kept free of heavy imports: ``evaluate.py`` validates analysis names against the registry before torch loads, and
imports a module here only once it is selected.
"""
