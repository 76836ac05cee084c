"""scripts/order_recipe_gpu.sh: every cell it would launch composes and passes train.py's pre-flight check.

The script runs only on a GPU machine (docs/order_use.md), where a cell whose config no longer composes (a
renamed group option, a dropped key) costs minutes of a 15-minute budget and comes back as an empty log.  Here the
script runs in its DRY mode with ``python3`` replaced by a stub that records each cell's command line; every
recorded cell is then composed in-process (Hydra's compose API) and checked like train.py checks it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, compose

MODES = "study,haviv,schemes,large,long,switches,sweep"


def recorded_cells(tmp_path: Path, modes: str = MODES, **env_extra: str) -> list[list[str]]:
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$*" >> "$CELL_LOG"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}", "CELL_LOG": str(tmp_path / "cells.txt"),
           "DRY": "1", "LARGE_OBJECTIVES": "mlm clm", "OUT": str(tmp_path / "out"), "GPU_RUNS": str(tmp_path / "gpu_runs"),
           **env_extra}
    (tmp_path / "out").mkdir()
    subprocess.run(["bash", str(ROOT / "scripts" / "order_recipe_gpu.sh"), modes], env=env, check=True,
                   capture_output=True, timeout=120)
    lines = (tmp_path / "cells.txt").read_text().splitlines()
    cells = [shlex.split(line) for line in lines if line.startswith("train.py ")]  # not the MPS warm-up call
    return [[a for a in c[1:] if not a.startswith("hydra.") and a != "--cfg" and a != "job"] for c in cells]


@pytest.mark.slow
def test_every_cell_of_the_gpu_script_composes_and_passes_the_preflight_check(tmp_path):
    from outlierlab.jobs.startup import check_train_config

    cells = recorded_cells(tmp_path)
    # study 10 + 3 recipe variants, haviv 2 x 2 x 5, schemes 4 x 3, large 2 x 2 (seed 1), long 4, switches 3 x 3,
    # sweep 8 real + 8 task
    assert len(cells) == 13 + 20 + 12 + 4 + 4 + 9 + 16, len(cells)
    assert not list((tmp_path / "gpu_runs").glob("*/*.log")), "DRY mode launched a cell"
    distinct = {tuple(a for a in c if not a.startswith("seed=")) for c in cells}  # seeds compose alike
    for overrides in sorted(distinct):
        cfg = compose("train", list(overrides))
        check_train_config(cfg)  # raises with the one line train.py would print
        assert cfg.trainer.accelerator == "gpu", overrides
    long = [c for c in cells if "trainer.max_steps=20000" in c and "data=english_large" in c]
    assert sorted(a for c in long for a in c if a.startswith("pos=")) == ["pos=learned", "pos=none", "pos=rope",
                                                                          "pos=sinusoidal"]
    assert compose("train", [a for a in long[0] if not a.startswith("seed=")]).trainer.max_steps == 20000
    switches = [c for c in cells if any(a.startswith("arch=") for a in c)]
    assert sorted({a for c in switches for a in c if a.startswith("arch=")}) == ["arch=default", "arch=op", "arch=pre_ln"]
    op = compose("train", [a for a in switches[1] if not a.startswith("seed=")])
    assert "arch=op" in switches[1] and op.trainer.max_steps == 6000 and op.data.batch_size == 128  # the recipe's
    assert op.model.block == "op" and op.lr == 1e-3
    large = [c for c in cells if "data=english_large" in c and c not in long and c not in switches]
    assert {a for c in large for a in c if a.startswith("pos=")} == {"pos=learned", "pos=none"}
    assert {a for c in large for a in c if a.startswith("objective=")} == {"objective=mlm", "objective=clm"}



def test_study_seeds_are_a_variable(tmp_path):
    cells = recorded_cells(tmp_path, "study", STUDY_SEEDS="6 7")
    study = [c for c in cells if any(a.startswith("seed=") for a in c)]  # not the three recipe variants
    assert sorted({a for c in study for a in c if a.startswith("seed=")}) == ["seed=6", "seed=7"] and len(study) == 4


def test_extra_overrides_reach_every_cell_and_compose(tmp_path):
    from outlierlab.jobs.startup import check_train_config

    cells = recorded_cells(tmp_path, "schemes", EXTRA="data=english_large objective=mlm", SCHEMES_SEEDS="4 5")
    assert len(cells) == 4 * 2
    assert all("data=english_large" in c and "objective=mlm" in c for c in cells)
    assert {a for c in cells for a in c if a.startswith("seed=")} == {"seed=4", "seed=5"}
    cfg = compose("train", [a for a in cells[0] if not a.startswith("seed=")])
    check_train_config(cfg)
    assert cfg.objective == "mlm" and "english_large" in str(cfg.data)
