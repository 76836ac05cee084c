#!/usr/bin/env python
"""Probe any frozen encoder (Luo, Kulmizev & Mao 2021): position probe (§3) or linear classifiers (§4.4).

    python probe.py                                         # position probe, all-MiniLM-L6-v2, offline
    python probe.py encoder.name_or_path=<run dir | model dir | hub id> transform=[none,clip,whiten]
    python probe.py task=wordnet_pos | task=sst2 | task=local task.files=[train.csv]

Outputs in the run dir (``hydra.run.dir``): ``position_probe.csv`` or ``classifier.csv`` (one row per
layer x transform), ``probe_report.md``, PNG plots, ``probe_info.json``, TensorBoard scalars
``probe/<transform>/layer_<i>/accuracy`` under ``tensorboard/``; with the position probe ``order_use.csv``
(does the model use the order it carries? ``probe.order_use=false`` skips it). Settings: ``configs/probe.yaml``.
"""

from __future__ import annotations

from outlierlab.configuration.composing import register_resolvers
from outlierlab.configuration.overrides import check_overrides
from outlierlab.jobs.run_errors import CELL_FAILED, run_main
from outlierlab.jobs.startup import check_device

register_resolvers()
check_overrides(config_name="probe")  # unknown encoder=/task=/transform= -> one line listing valid names, before slow imports

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402


def _check(cfg: DictConfig) -> None:
    # lazy: models imports torch; only once Hydra has composed a config (a bad override failed above)
    from outlierlab.models.encoder_source import resolve_encoder

    for node, key, example in (("encoder", "name_or_path", "encoder.name_or_path=outputs/train/RUN"),
                               ("task", "files", "task.files=[train.csv]")):
        if key in cfg[node].keys() and OmegaConf.is_missing(cfg[node], key):  # `in` is False for ???
            raise ValueError(f"{node}.{key} is required here: e.g. {example}")
    from outlierlab.configuration.probe_settings import check_settings
    from outlierlab.datamodules.validation import validate_inputs  # lazy: module level imports only startup + Hydra

    check_settings(cfg)  # a refused probe setting: one line before torch and Lightning load
    validate_inputs(cfg, "probe")  # every data file and the encoder path, one line per fault
    rev = cfg.encoder.get("revision")
    resolve_encoder(str(cfg.encoder.name_or_path), None if rev is None else str(rev))
    check_device(OmegaConf.select(cfg, "encoder.device"))  # cuda without a GPU: one line now, not mid-run


@hydra.main(config_path="configs", config_name="probe", version_base="1.3")
def main(cfg: DictConfig) -> None:
    if run_main(_check, cfg) is CELL_FAILED:  # missing value, bad path, offline hub: fail now, in one line
        return  # a multirun cell that failed its checks (recorded); the sweep goes on
    from outlierlab.evaluation.probing import run  # lazy: heavy imports only after the config is valid

    run_dir = HydraConfig.get().runtime.output_dir
    # run() holds the directory's lock (one process per output directory: a study launched twice)
    out = run_main(lambda c: run(c, run_dir), cfg)
    if out is CELL_FAILED:
        return
    print(f"probe done: {len(out['rows'])} rows -> {run_dir}")


if __name__ == "__main__":
    main()
