"""``module.compile=true``: the compiled training step trains the same model as the eager one.

Compilation with Inductor on CPU takes tens of seconds per graph (more on a loaded machine), so these
are marked ``slow``.  Tolerances: Inductor fuses and reorders float32 reductions, so losses agree to
~1e-6 relative, not bitwise; we allow 1e-4 absolute on losses around 7 (ln of the 1000-token vocabulary).
"""
from __future__ import annotations

import pytest
import torch

from tests.run_fixtures import final_weights, small_cfg, train_losses

pytestmark = pytest.mark.slow

NO_DROPOUT = ["model.dropout=0.0", "model.attention_dropout=0.0"]
COMMON = ["trainer.limit_val_batches=0", "module.scheduler.num_training_steps=6",
          "module.scheduler.num_warmup_steps=2", "callbacks=none", "logger=default"]


def test_compiled_and_eager_training_give_the_same_losses(tmp_path, shared_cache):
    import torch._dynamo
    from torch._dynamo.utils import counters

    from outlierlab.jobs.training import train

    torch._dynamo.reset()
    counters.clear()
    train(small_cfg(tmp_path / "eager", "trainer.max_steps=4", *NO_DROPOUT, *COMMON))
    assert counters["stats"]["unique_graphs"] == 0  # eager really is eager
    train(small_cfg(tmp_path / "compiled", "trainer.max_steps=4", "module.compile=true", *NO_DROPOUT, *COMMON))
    # ... and the switch really compiles, once: the number of masked tokens, different in every batch, is a
    # symbolic length from the first step (without it the second batch recompiled the whole forward: 2 graphs)
    assert counters["stats"]["unique_graphs"] == 1
    eager, compiled = train_losses(tmp_path / "eager"), train_losses(tmp_path / "compiled")
    assert sorted(eager) == sorted(compiled) == [0, 1, 2, 3]
    for step in eager:  # step 0 is the same forward; later steps also test the compiled backward
        assert compiled[step] == pytest.approx(eager[step], abs=1e-4), step


def test_resume_equals_uninterrupted_with_compile_on(tmp_path, shared_cache):
    """3 steps + resume to 6 == 6 straight steps, compiled, with dropout on (seeded per step)."""
    from outlierlab.jobs.training import train

    common = ["module.compile=true", "callbacks=default", "callbacks.model_checkpoint.every_n_train_steps=3",
              "trainer.limit_val_batches=0", "module.scheduler.num_training_steps=6",
              "module.scheduler.num_warmup_steps=2", "callbacks.layernorm_monitor=null",
              "callbacks.hidden_state_monitor=null"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(small_cfg(straight, "trainer.max_steps=6", *common))
    train(small_cfg(resumed, "trainer.max_steps=3", *common))
    train(small_cfg(resumed, "trainer.max_steps=6", "ckpt_path=last", *common))
    a, b = train_losses(straight), train_losses(resumed)
    for step in range(3, 6):
        assert b[step] == pytest.approx(a[step], abs=1e-5), step
    wa, wb = final_weights(straight), final_weights(resumed)
    # checkpoints keep the eager parameter names: no "_orig_mod." copies of the compiled function's model
    assert all(k.startswith("model.") and "_orig_mod" not in k for k in wb)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-5), k
