"""Studies: many runs compared the way a paper must.

* :mod:`~outlierlab.studies.aggregate` -- ``python -m outlierlab.studies.aggregate <sweeps or tables>``: a seed study's
  means, confidence intervals, contrasts and declared families of tests, ``study.md`` and its curves;
* :mod:`~outlierlab.studies.cells` (reading a study's run directories, each checked by
  :mod:`~outlierlab.studies.cell_checks`), :mod:`~outlierlab.studies.design` (which tests are corrected together),
  :mod:`~outlierlab.studies.replicates` (the same configuration and seed on two code versions),
  :mod:`~outlierlab.studies.report` (``study.md`` and the curves);
* :mod:`~outlierlab.studies.table` -- a study's run directories as one Parquet table, and back;
* :mod:`~outlierlab.studies.committed` -- every study the docs report, remade by one command, and
  :mod:`~outlierlab.studies.doc_tables` (the docs' generated tables, with :mod:`~outlierlab.studies.order_use_doc_tables`,
  :mod:`~outlierlab.studies.doc_table_reads` and :mod:`~outlierlab.studies.emergence_tables`);
* the studies' own reports: :mod:`~outlierlab.studies.dim_identity` (which dimension, since when),
  :mod:`~outlierlab.studies.objectives_report` (masked vs causal), :mod:`~outlierlab.studies.ladder` (the scale ladder).
"""
