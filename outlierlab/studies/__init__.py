"""Studies: many runs compared the way a paper must.

* ``aggregate`` -- ``python -m outlierlab.studies.aggregate <sweeps or tables>``: a seed study's
  means, confidence intervals, contrasts and declared families of tests, ``study.md`` and its curves;
* ``cells`` (a study's run directories, each checked by ``cell_checks``), ``design`` (which tests are corrected
  together), ``replicates`` (one configuration and seed on two code versions), ``report`` (``study.md``, curves);
* the statistics they apply: ``seed_statistics`` (means and confidence intervals over seeds, contrasts) and
  ``study_inference`` (families of tests and their corrections, equivalence, detectable effects);
* ``table`` -- a study's run directories as one Parquet table, and back;
* the studies' own reports: ``dim_identity`` (which dimension, since when), ``ladder`` (the scale ladder),
  ``position_profile`` and ``ablation_table`` (evaluate runs side by side).

The repository's own docs tables and the command that remakes every committed study are not part of the package:
they live in the repository's ``lab/`` (``python -m lab.committed``, ``python -m lab.doc_tables``).
"""
