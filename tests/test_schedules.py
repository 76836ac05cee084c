"""The warm-up + polynomial-decay schedule: every max_steps around the warm-up trains to the end."""

from __future__ import annotations

import pytest
import torch

from outlierlab.models.schedules import warmup_polynomial_decay

PEAK, WARMUP = 1.0e-3, 4


def lrs_over_run(max_steps: int, warmup: int = WARMUP, lr_end: float = 0.0, power: float = 1.0) -> list[float]:
    """Learning rate of every optimizer step 0..max_steps-1, plus the one the scheduler computes after the last
    step (Lightning steps the scheduler once more after the final optimizer step: where the old code crashed)."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=PEAK)
    sched = warmup_polynomial_decay(opt, warmup, max_steps, lr_end=lr_end, power=power)
    out = []
    for _ in range(max_steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    out.append(opt.param_groups[0]["lr"])
    return out


# (max_steps, lr at the first step, the highest lr reached, lr at the last step, lr after the last step)
# hand-computed for warm-up 4, peak 1e-3, lr_end 0, power 1: warm-up gives 0, .25, .5, .75, then 1 x peak.
CASES = [
    (WARMUP - 1, 0.0, 0.75e-3, 0.50e-3, 0.75e-3),  # warm-up never finishes; keeps rising, no decay
    (WARMUP, 0.0, 1.00e-3, 0.75e-3, 1.00e-3),      # no decay steps: the peak is held (transformers: ZeroDivisionError)
    (WARMUP + 1, 0.0, 1.00e-3, 1.00e-3, 0.0),      # one decay step: peak at step 4, lr_end after it
]


@pytest.mark.parametrize("max_steps, first, peak, last, after", CASES)
def test_lr_at_first_peak_and_last_step(max_steps, first, peak, last, after):
    lrs = lrs_over_run(max_steps)
    assert len(lrs) == max_steps + 1
    assert lrs[0] == pytest.approx(first, abs=1e-12)
    assert max(lrs) == pytest.approx(peak, abs=1e-12)
    assert lrs[max_steps - 1] == pytest.approx(last, abs=1e-12)
    assert lrs[max_steps] == pytest.approx(after, abs=1e-12)


def test_decay_with_power_and_lr_end_hand_computed():
    # warm-up 2, max 6, power 2, lr_end 1e-4: step 4 is half-way through the 4 decay steps:
    # (1e-3 - 1e-4) * (1 - 2/4)**2 + 1e-4 = 3.25e-4; step 3: 0.9e-3 * 0.75**2 + 1e-4 = 6.0625e-4
    lrs = lrs_over_run(6, warmup=2, lr_end=1e-4, power=2.0)
    assert lrs[:2] == pytest.approx([0.0, 0.5e-3])
    assert lrs[2] == pytest.approx(1e-3)
    assert lrs[3] == pytest.approx(6.0625e-4)
    assert lrs[4] == pytest.approx(3.25e-4)
    assert lrs[6] == pytest.approx(1e-4)  # reaches lr_end exactly at max_steps


@pytest.mark.parametrize("warmup, max_steps", [(0, 5), (3, 10), (30, 300)])
def test_matches_transformers_where_it_is_defined(warmup, max_steps):
    from transformers import get_polynomial_decay_schedule_with_warmup

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=PEAK)
    ref = get_polynomial_decay_schedule_with_warmup(opt, warmup, max_steps, lr_end=1e-5, power=1.5)
    expected = [ref.lr_lambdas[0](s) * PEAK for s in range(max_steps + 3)]
    mine = warmup_polynomial_decay(torch.optim.SGD([param], lr=PEAK), warmup, max_steps, lr_end=1e-5, power=1.5)
    assert [mine.lr_lambdas[0](s) * PEAK for s in range(max_steps + 3)] == pytest.approx(expected)


def test_resume_follows_the_current_max_steps():
    """The closure is not checkpointed: a resumed run that extends max_steps decays over the new length."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=PEAK)
    sched = warmup_polynomial_decay(opt, 2, 4)
    for _ in range(3):
        opt.step(); sched.step()
    state = sched.state_dict()
    opt2 = torch.optim.SGD([param], lr=PEAK)
    sched2 = warmup_polynomial_decay(opt2, 2, 8)
    sched2.load_state_dict(state)
    assert sched2.lr_lambdas[0](3) == pytest.approx(1 - 1 / 6)  # 8-step curve, not the saved 4-step one


@pytest.mark.parametrize("kwargs, message", [
    ({"num_warmup_steps": -1, "num_training_steps": 5}, "num_warmup_steps must be >= 0"),
    ({"num_warmup_steps": 1, "num_training_steps": 0}, "num_training_steps must be >= 1"),
    ({"num_warmup_steps": 1, "num_training_steps": 5, "lr_end": 1.0}, "must not exceed the peak"),
])
def test_bad_arguments_are_one_line(kwargs, message):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    with pytest.raises(ValueError, match=message):
        warmup_polynomial_decay(opt, **kwargs)
