"""Pretrain a RoBERTa encoder with a chosen position scheme: ``python train.py pos=none``.

Thin Hydra entry point; the job itself is :func:`outlierlab.jobs.training.train`.
"""

import json
import os
import sys

from outlierlab.configuration.composing import register_resolvers
from outlierlab.configuration.overrides import check_overrides
from outlierlab.jobs.run_errors import run_main
from outlierlab.jobs.run_state import skip_finished
from outlierlab.jobs.startup import check_train_config, describe_plan

if os.environ.get("LOCAL_RANK", "0") != "0" and "OUTLIERLAB_CHILD_ARGV" in os.environ:
    # A DDP child started by Lightning: run exactly the parent's job, never a new sweep.
    sys.argv = [sys.argv[0], *json.loads(os.environ["OUTLIERLAB_CHILD_ARGV"])]
register_resolvers()
check_overrides(config_name="train")  # unknown pos=/model=/data=... -> one line, before the slow imports

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    def job(cfg: DictConfig) -> dict[str, float]:
        skipped = skip_finished(cfg)  # a finished cell of a relaunched study: said in one line, before torch loads
        if skipped is not None:
            return skipped
        rank0 = os.environ.get("LOCAL_RANK", "0") == "0"  # DDP children validate too, but say it once
        for warning in check_train_config(cfg):  # a setting that cannot work fails here, in seconds
            if rank0:
                print(f"warning: {warning}", file=sys.stderr, flush=True)
        from outlierlab.datamodules.validation import validate_inputs  # lazy: module level imports only startup + Hydra

        validate_inputs(cfg, "train")  # data.files: missing/empty/non-UTF-8/truncated gzip -> one line
        if rank0:
            print(describe_plan(cfg), flush=True)
        from outlierlab.jobs.training import train  # lazy: torch/Lightning load only once the config is valid

        return train(cfg)

    metrics = run_main(job, cfg)  # a failed or skipped cell of a multirun returns run_errors.CELL_FAILED
    return metrics.get("val/loss") if isinstance(metrics, dict) else None  # for Hydra sweepers


if __name__ == "__main__":
    main()
