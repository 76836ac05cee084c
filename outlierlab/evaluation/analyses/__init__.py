"""The built-in analyses of ``evaluate.py`` and ``outlierlab.api.evaluate``, one module each.

``analyses=[outliers,wic]`` names modules here (``registry.ANALYSIS_MODULES``).  Each is an ordinary subscriber of the
engine -- ``run(ctx)``, optionally ``check(ctx)`` and ``consumers(ctx)`` -- as one's own analysis would be
(docs/extending.md); formulas live in ``outlierlab.metrics``.  Shared helpers: ``ln_rule``, ``layer_rows``,
``wic_targets``.  Free of heavy imports: names are validated before torch loads.
"""
