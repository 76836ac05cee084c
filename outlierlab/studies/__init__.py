"""Studies: many runs compared the way a paper must.

* ``aggregate`` -- ``python -m outlierlab.studies.aggregate <sweeps or tables>``: a seed study's
  means, confidence intervals, contrasts and declared families of tests, ``study.md`` and its curves;
* ``cells`` (reading a study's run directories, each checked by
  ``cell_checks``), ``design`` (which tests are corrected together),
  ``replicates`` (the same configuration and seed on two code versions),
  ``report`` (``study.md`` and the curves);
* ``table`` -- a study's run directories as one Parquet table, and back;
* ``committed`` -- every study the docs report, remade by one command, and
  ``doc_tables`` (the docs' generated tables, with ``order_use_doc_tables``,
  ``doc_table_reads`` and ``emergence_tables``);
* the studies' own reports: ``dim_identity`` (which dimension, since when),
  ``objectives_report`` (masked vs causal), ``ladder`` (the scale ladder).
"""
