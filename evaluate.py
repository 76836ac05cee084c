#!/usr/bin/env python
"""Vector-space geometry and semantic quality of every layer of any frozen encoder, for the raw vectors and
after clipping the outlier dims / whitening, side by side (Luo, Kulmizev & Mao 2021 §2, §4; Ethayarajh 2019).

    python evaluate.py                                       # all-MiniLM-L6-v2, shipped data, offline, minutes
    python evaluate.py encoder.name_or_path=outputs/train/RUN  # a train.py run (or a model dir, or a hub id)
    python evaluate.py analyses=[outliers,anisotropy] transform=[none,clip] transform.dims=[588]
    python evaluate.py data.files=[a.txt] wic.files=[pairs.jsonl] sts.files=[sts.csv] seed=1
    python evaluate.py wic=superglue sts=paper               # hub data (network once, then the datasets cache)

Outputs in the run dir (``hydra.run.dir``): ``<analysis>.csv`` (one row per layer x transform),
``report.md`` (tables shaped like Luo et al. Tables 1-2 / Fig. 6), ``results.json``, PNG plots,
``layernorm.csv`` and TensorBoard scalars ``eval/<analysis>/<transform>/<stat>`` (step = layer) under
``tensorboard/``.  Analyses are modules registered in :mod:`outlierlab.evaluation.registry`.  Settings:
``configs/evaluate.yaml``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from outlierlab.configuration.composing import register_resolvers
from outlierlab.configuration.overrides import check_overrides
from outlierlab.evaluation.run_writer import evaluate
from outlierlab.jobs.run_errors import run_main
from outlierlab.jobs.startup import check_device


@hydra.main(config_path="configs", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    def job(c: DictConfig) -> dict:
        check_device(OmegaConf.select(c, "encoder.device"))  # cuda without a GPU: one line now, not mid-pass
        # the job locks the output directory: one process per directory (a study launched twice)
        return evaluate(c, Path(HydraConfig.get().runtime.output_dir))

    run_main(job, cfg)


if __name__ == "__main__":
    register_resolvers()
    check_overrides(sys.argv[1:], config_name="evaluate")  # unknown encoder=/transform=/wic=/sts= -> one line, before heavy imports
    main()
