"""train.py's intra-op threads: the config's ``threads``, else the environment's OMP_NUM_THREADS (a cluster slot, a
test worker), else the machine's cores divided among the cells running at once."""

from __future__ import annotations

import os

import torch

from outlierlab.jobs.training import set_threads


def test_threads_come_from_the_config_then_the_environment_then_the_cores(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert set_threads(None) == 1 == torch.get_num_threads()      # the share the environment gave
        assert set_threads(2) == 2 == torch.get_num_threads()         # the config wins
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert set_threads(None) == max(1, os.cpu_count() or 1)       # one cell: every core
        monkeypatch.setenv("OMP_NUM_THREADS", "many")                 # not a number: ignored
        assert set_threads(None) == max(1, os.cpu_count() or 1)
    finally:
        torch.set_num_threads(before)
