"""outlierlab: pretrain, monitor, probe and evaluate masked-language-model encoders for outlier dimensions and
positional artefacts (Luo, Kulmizev & Mao 2021; Kovaleva et al. 2021; Puccetti et al. 2022).

One sub-package per role; each imports only the ones below it (tests/test_layout.py checks it):

    jobs → lightning_modules → evaluation → reports → datamodules → models → analysis → utils

The entry points ``train.py``, ``probe.py`` and ``evaluate.py`` sit in the repository root, beside ``configs/``.
Everything lives under this one name so that installing the project never shadows another package
(``evaluate``, ``utils``, ``models`` are common top-level names).
"""
