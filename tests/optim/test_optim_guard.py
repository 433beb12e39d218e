"""PrecisionGuard: a loop that forgot create_optimizer fails at its first step, resumed or not."""

from __future__ import annotations

import pytest
import torch
from optim_helpers import TinyDraft, tiny_loss

from eagle_train.optim import (
    OptimConfig,
    PrecisionError,
    PrecisionGuard,
    create_optimizer,
    find_precision_problems,
)


def run_loop(
    model: torch.nn.Module, opt: torch.optim.Optimizer, guard: PrecisionGuard, steps: range
) -> None:
    """The shape of the training loop: backward, step, guard."""
    for step in steps:
        opt.zero_grad()
        tiny_loss(model, step).backward()
        opt.step()
        guard.after_step(opt, step)


def test_refuses_plain_adamw_at_the_end_of_the_first_step() -> None:
    model = TinyDraft()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(PrecisionError) as err:
        run_loop(model, opt, PrecisionGuard(), range(1, 10))
    message = str(err.value)
    assert "at step 1" in message
    assert "create_optimizer" in message and "fp32_master_weights=false" in message
    assert "not float32" in message and "no fp32 master" in message
    assert int(opt.state[model.fc.weight]["step"]) == 1  # it stopped after one step


def test_refuses_a_resumed_plain_adamw_loop_at_its_first_observed_step() -> None:
    model = TinyDraft()
    first = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run_loop(model, first, PrecisionGuard(enabled=False), range(1, 4))
    resumed = torch.optim.AdamW(model.parameters(), lr=1e-3)
    resumed.load_state_dict(first.state_dict())
    with pytest.raises(PrecisionError, match="at step 501"):
        run_loop(model, resumed, PrecisionGuard(), range(501, 510))


def test_accepts_create_optimizer_and_costs_nothing_afterwards() -> None:
    model = TinyDraft()
    opt = create_optimizer(model, OptimConfig())
    guard = PrecisionGuard()
    run_loop(model, opt, guard, range(1, 3))
    assert guard.verified_at_step == 1
    # Later calls do not look at the state again (no per-step cost): corrupting it now
    # goes unnoticed by the guard, but find_precision_problems still sees it.
    opt.state[model.fc.weight]["exp_avg"] = opt.state[model.fc.weight]["exp_avg"].bfloat16()
    guard.after_step(opt, 3)
    assert find_precision_problems(opt) == [
        "fc.weight: optimizer state 'exp_avg' is torch.bfloat16, not float32"
    ]


def test_a_resumed_run_is_checked_at_its_first_step() -> None:
    model = TinyDraft()
    opt = create_optimizer(model, OptimConfig())
    run_loop(model, opt, PrecisionGuard(), range(1, 3))
    resumed = create_optimizer(model, OptimConfig())
    resumed.load_state_dict(opt.state_dict())
    guard = PrecisionGuard()
    run_loop(model, resumed, guard, range(3, 5))
    assert guard.verified_at_step == 3


def test_disabled_guard_is_the_explicit_opt_out() -> None:
    model = TinyDraft()
    cfg = OptimConfig(fp32_master_weights=False)
    opt = create_optimizer(model, cfg)
    guard = PrecisionGuard(enabled=cfg.fp32_master_weights)
    run_loop(model, opt, guard, range(1, 3))
    assert guard.verified_at_step is None
    assert find_precision_problems(opt)  # pure bf16 state, as configured


def test_params_without_grads_yet_are_not_reported() -> None:
    model = TinyDraft()
    opt = create_optimizer(model, OptimConfig())
    opt.zero_grad()
    model.head.weight.sum().float().backward()  # only the head gets a gradient
    opt.step()
    assert find_precision_problems(opt) == []
