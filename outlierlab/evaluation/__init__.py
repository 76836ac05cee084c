"""The analyses of ``evaluate.py`` (one module each, registered in :mod:`outlierlab.evaluation.registry`).

Kept free of heavy imports: ``evaluate.py`` validates analysis names against the registry before torch loads.
"""
