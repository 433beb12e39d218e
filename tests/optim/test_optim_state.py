"""Optimizer state: bit-exact resume, the load_state_dict cast trap, plain-AdamW states."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import torch
from optim_helpers import (
    BODY_SHAPES,
    TAIL_SHAPES,
    grad_stream,
    make_params,
    one_thread,  # noqa: F401 - fixture
)
from torch import nn

from eagle_train.optim import MasterWeightAdamW

SHAPES = BODY_SHAPES + TAIL_SHAPES
HYPER = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01}


def roundtrip(obj: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def train(params: list[nn.Parameter], opt: torch.optim.Optimizer, grads: list) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g
        opt.step()


def snapshot(params: list[nn.Parameter], opt: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{"param": p.detach().clone(), **opt.state[p]} for p in params]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("implementation", ["fused", "foreach", "compiled"])
def test_resume_is_bitwise_equal_to_uninterrupted_run(implementation: str) -> None:
    grads = list(grad_stream(SHAPES, 60))
    straight = make_params(SHAPES, torch.bfloat16)
    straight_opt = MasterWeightAdamW(straight, **HYPER, implementation=implementation)
    train(straight, straight_opt, grads)

    first = make_params(SHAPES, torch.bfloat16)
    first_opt = MasterWeightAdamW(first, **HYPER, implementation=implementation)
    train(first, first_opt, grads[:25])
    saved_model = roundtrip([p.detach() for p in first])
    saved_opt = roundtrip(first_opt.state_dict())
    assert all(saved_opt["state"][i]["master"].dtype == torch.float32 for i in range(len(SHAPES)))

    # A fresh model and optimizer, as after a restart (different initial values on purpose).
    resumed = make_params(SHAPES, torch.bfloat16, seed=123)
    with torch.no_grad():
        for p, saved in zip(resumed, saved_model, strict=True):
            p.copy_(saved)
    resumed_opt = MasterWeightAdamW(resumed, **HYPER, implementation=implementation)
    resumed_opt.load_state_dict(saved_opt)
    for p in resumed:
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert resumed_opt.state[p][key].dtype == torch.float32, key
    train(resumed, resumed_opt, grads[25:])

    pairs = zip(snapshot(straight, straight_opt), snapshot(resumed, resumed_opt), strict=True)
    for want, got in pairs:
        for key in ("param", "master", "exp_avg", "exp_avg_sq", "step"):
            assert want[key].dtype == got[key].dtype, key
            assert torch.equal(want[key], got[key]), key


class NaiveLoad(MasterWeightAdamW):
    """What a subclass gets by trusting torch's Optimizer.load_state_dict."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.optim.Optimizer.load_state_dict(self, state_dict)


class OverrideCastPolicy(NaiveLoad):
    """Overriding the cast policy does not help: torch calls it class-qualified."""

    @staticmethod
    def _process_value_according_to_param_policy(param, value, param_id, param_groups, key=None):
        return value


@pytest.mark.parametrize("naive", [NaiveLoad, OverrideCastPolicy])
def test_plain_load_state_dict_would_round_state_to_bf16(naive: type[MasterWeightAdamW]) -> None:
    """The trap the override exists for: torch casts master and moments to the param dtype."""
    params = make_params(SHAPES, torch.bfloat16)
    opt = MasterWeightAdamW(params, **HYPER)
    train(params, opt, list(grad_stream(SHAPES, 5)))
    saved = roundtrip(opt.state_dict())

    trapped = make_params(SHAPES, torch.bfloat16)
    trapped_opt = naive(trapped, **HYPER)
    trapped_opt.load_state_dict(saved)
    state = trapped_opt.state[trapped[0]]
    assert state["master"].dtype == torch.bfloat16
    assert state["exp_avg_sq"].dtype == torch.bfloat16
    assert not torch.equal(state["master"].float(), saved["state"][0]["master"])

    fixed = make_params(SHAPES, torch.bfloat16)
    fixed_opt = MasterWeightAdamW(fixed, **HYPER)
    fixed_opt.load_state_dict(saved)
    assert torch.equal(fixed_opt.state[fixed[0]]["master"], saved["state"][0]["master"])


@pytest.mark.usefixtures("one_thread")
def test_loads_a_plain_adamw_state() -> None:
    """A state written by torch.optim.AdamW on the same bf16 params: no KeyError; moments
    upcast exactly, master derived from the param, and training continues."""
    params = make_params(SHAPES, torch.bfloat16)
    plain = torch.optim.AdamW(params, **HYPER)
    grads = list(grad_stream(SHAPES, 10))
    train(params, plain, grads)
    saved = roundtrip(plain.state_dict())
    assert "master" not in saved["state"][0]

    opt = MasterWeightAdamW(params, **HYPER)
    opt.load_state_dict(saved)
    for i, p in enumerate(params):
        state = opt.state[p]
        assert torch.equal(state["master"], p.detach().float())
        for key in ("exp_avg", "exp_avg_sq"):
            assert state[key].dtype == torch.float32
            assert torch.equal(state[key], saved["state"][i][key].float())
        assert int(state["step"]) == 10
    train(params, opt, grads[:3])
    assert int(opt.state[params[0]]["step"]) == 13
    assert opt.state[params[0]]["master"].dtype == torch.float32


def test_state_dict_holds_fp32_master_and_moments() -> None:
    params = make_params(SHAPES, torch.bfloat16)
    opt = MasterWeightAdamW(params, **HYPER)
    train(params, opt, list(grad_stream(SHAPES, 2)))
    for entry in opt.state_dict()["state"].values():
        assert {"step", "master", "exp_avg", "exp_avg_sq"} <= set(entry)
        assert all(entry[k].dtype == torch.float32 for k in ("master", "exp_avg", "exp_avg_sq"))


def test_refuses_amsgrad_state_and_mismatched_shapes() -> None:
    params = make_params(SHAPES, torch.bfloat16)
    amsgrad = torch.optim.AdamW(params, amsgrad=True)
    train(params, amsgrad, list(grad_stream(SHAPES, 1)))
    with pytest.raises(ValueError, match="amsgrad"):
        MasterWeightAdamW(params).load_state_dict(amsgrad.state_dict())

    small = make_params([(3,)], torch.bfloat16)
    opt = MasterWeightAdamW(small)
    train(small, opt, list(grad_stream([(3,)], 1)))
    other = make_params([(4,)], torch.bfloat16)
    with pytest.raises(ValueError, match="shape"):
        MasterWeightAdamW(other).load_state_dict(opt.state_dict())


def test_deepcopy_keeps_the_kernel_choice_and_fp32_state() -> None:
    params = make_params([(16,)], torch.bfloat16)
    opt = MasterWeightAdamW(params, implementation="foreach")
    train(params, opt, list(grad_stream([(16,)], 1)))
    clone = copy.deepcopy(opt)
    assert clone.implementation == "foreach"
    (state,) = clone.state.values()
    assert state["master"].dtype == torch.float32
