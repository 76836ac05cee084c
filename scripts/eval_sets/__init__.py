"""Parts of ``scripts/build_eval_data.py``, one module per evaluation set.

``common`` (source paths, file names, word rule, deterministic gzip writers), ``sentences``,
``wic``, ``wordnet_pos`` (the three set builders) and ``notice`` (NOTICE.md from the files
written). The command users run stays ``python scripts/build_eval_data.py``.
"""
