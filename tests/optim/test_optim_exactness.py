"""MasterWeightAdamW against torch's AdamW on an fp32 copy: bitwise, 1000 steps.

Every kernel path is compared with torch's AdamW using the same kernel: ``foreach`` with
``foreach=True``, ``fused`` and ``compiled`` with ``fused=True``.
"""

from __future__ import annotations

import pytest
import torch
from optim_helpers import (
    BODY_SHAPES,
    TAIL_SHAPES,
    grad_stream,
    make_params,
    one_thread,  # noqa: F401 - fixture
    ulp_distance,
)
from torch import nn

from eagle_train.optim import MasterWeightAdamW

HYPER = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01}
STEPS = 1000
NEEDS_FMA = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
    reason="torch's CPU kernels round through a hardware FMA only on AVX2/AVX512 builds",
)


def run_pair(
    shapes: list[tuple[int, ...]],
    implementation: str,
    reference_kernel: dict[str, bool],
    steps: int,
) -> tuple[list[nn.Parameter], MasterWeightAdamW, list[nn.Parameter], torch.optim.AdamW]:
    ours = make_params(shapes, torch.bfloat16)
    ref = make_params(shapes, torch.float32)
    opt = MasterWeightAdamW(ours, **HYPER, implementation=implementation)
    ref_opt = torch.optim.AdamW(ref, **HYPER, **reference_kernel)
    for grads in grad_stream(shapes, steps):
        for p, q, g in zip(ours, ref, grads, strict=True):
            p.grad = g  # bf16 for us ...
            q.grad = g.float()  # ... the same values as fp32 for the reference
        opt.step()
        ref_opt.step()
    return ours, opt, ref, ref_opt


def assert_bitwise(ours, opt, ref, ref_opt) -> None:
    for p, q in zip(ours, ref, strict=True):
        state, ref_state = opt.state[p], ref_opt.state[q]
        assert p.dtype == torch.bfloat16
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert state[key].dtype == torch.float32, key
        assert torch.equal(state["master"], q.detach()), float((state["master"] - q).abs().max())
        assert torch.equal(state["exp_avg"], ref_state["exp_avg"])
        assert torch.equal(state["exp_avg_sq"], ref_state["exp_avg_sq"])
        assert torch.equal(p.detach(), state["master"].to(torch.bfloat16))
        assert int(state["step"]) == STEPS


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    ("implementation", "reference_kernel"),
    [("foreach", {"foreach": True}), ("fused", {"fused": True})],
)
def test_torch_kernel_paths_bitwise_equal_torch_adamw(implementation, reference_kernel) -> None:
    """The update runs torch's own kernel on the masters: bitwise equal for any shape."""
    shapes = BODY_SHAPES + TAIL_SHAPES
    assert_bitwise(*run_pair(shapes, implementation, reference_kernel, STEPS))


@NEEDS_FMA
@pytest.mark.usefixtures("one_thread")
def test_compiled_path_bitwise_equal_torch_fused_adamw() -> None:
    """The single-pass compiled kernel follows the rounding of torch's fused CPU AdamW
    vector loop (FMAs included), so tensors whose numel is a multiple of 16 match bitwise
    over 1000 steps. If the C++ compiler placed an FMA differently, this fails.

    (torch's kernel treats the last numel % vector-width elements in a scalar loop that
    the compiler contracts differently; see the tail test below.)"""
    assert_bitwise(*run_pair(BODY_SHAPES, "compiled", {"fused": True}, STEPS))


@NEEDS_FMA
@pytest.mark.usefixtures("one_thread")
def test_compiled_path_tail_elements_within_one_ulp_per_step() -> None:
    """Not bitwise on the scalar tail of torch's fused kernel: there GCC contracts
    ``exp_avg_sq * beta2 + (1 - beta2) * g * g`` as fma(exp_avg_sq, beta2, ...) while the
    vector loop (and our kernel, everywhere) computes fma((1 - beta2) * g, g,
    exp_avg_sq * beta2). Both are correctly rounded forms of nearly the same value, so
    from an identical state one step differs by at most 1 float32 ulp in exp_avg_sq and
    in the master, and exp_avg is equal. Bound checked over 200 random states."""
    ours = make_params(TAIL_SHAPES, torch.bfloat16)
    ref = [nn.Parameter(p.detach().float()) for p in ours]
    opt = MasterWeightAdamW(ours, **HYPER, implementation="compiled")
    ref_opt = torch.optim.AdamW(ref, **HYPER, fused=True)
    worst = {"master": 0, "exp_avg": 0, "exp_avg_sq": 0}
    for grads in grad_stream(TAIL_SHAPES, 200, seed=1):
        for p, q, g in zip(ours, ref, grads, strict=True):
            p.grad, q.grad = g, g.float()
        opt.step()
        ref_opt.step()
        for p, q in zip(ours, ref, strict=True):
            state, ref_state = opt.state[p], ref_opt.state[q]
            worst["master"] = max(worst["master"], ulp_distance(state["master"], q))
            for key in ("exp_avg", "exp_avg_sq"):
                worst[key] = max(worst[key], ulp_distance(state[key], ref_state[key]))
            # resynchronise, so every step starts from an identical state
            with torch.no_grad():
                for key in ("exp_avg", "exp_avg_sq"):
                    state[key].copy_(ref_state[key])
                state["master"].copy_(q)
                p.copy_(q)
    assert worst["exp_avg"] == 0
    assert worst["exp_avg_sq"] <= 1 and worst["master"] <= 1, worst


@pytest.mark.usefixtures("one_thread")
def test_fp32_params_get_no_master_and_match_torch() -> None:
    """fp32 params are their own master (no redundant copy); bf16 params beside them get one."""
    fp32 = make_params([(32, 8), (8,)], torch.float32)
    bf16 = make_params([(16,)], torch.bfloat16, seed=1)
    ref = [nn.Parameter(p.detach().clone()) for p in fp32]
    opt = MasterWeightAdamW(fp32 + bf16, **HYPER)
    ref_opt = torch.optim.AdamW(ref, **HYPER, fused=True)
    for grads in grad_stream([(32, 8), (8,), (16,)], 50):
        for p, g in zip(fp32 + bf16, grads, strict=True):
            p.grad = g.to(p.dtype)
        for q, g in zip(ref, grads[:2], strict=True):
            q.grad = g.float()
        opt.step()
        ref_opt.step()
    for p, q in zip(fp32, ref, strict=True):
        assert "master" not in opt.state[p]
        assert opt.state[p]["exp_avg"].dtype == torch.float32
        assert torch.equal(p, q)
    assert opt.state[bf16[0]]["master"].dtype == torch.float32
    state_bytes = sum(
        t.numel() * t.element_size() for t in opt.state[bf16[0]].values() if t.dim() > 0
    )
    assert state_bytes == 12 * bf16[0].numel()


@pytest.mark.usefixtures("one_thread")
def test_rmsnorm_gain_moves_only_with_fp32_masters() -> None:
    """The mechanism: an Adam step of ~lr on a gain at 1.0 is below half the bf16 spacing
    there (2^-8), so plain AdamW on bf16 rounds every update away; the master keeps it."""

    def train(make_opt) -> tuple[nn.RMSNorm, torch.optim.Optimizer]:
        torch.manual_seed(0)
        norm = nn.RMSNorm(16, dtype=torch.bfloat16)
        opt = make_opt(norm.parameters())
        x = torch.randn(32, 16).to(torch.bfloat16)
        for _ in range(200):
            opt.zero_grad()
            loss = (norm(x).float() - 1.5 * x.float()).pow(2).mean()  # wants gain 1.5
            loss.backward()
            opt.step()
        return norm, opt

    plain, _ = train(lambda ps: torch.optim.AdamW(ps, lr=5e-4, weight_decay=0.0))
    ours, opt = train(lambda ps: MasterWeightAdamW(ps, lr=5e-4, weight_decay=0.0))
    assert torch.all(plain.weight == 1.0)
    assert float(ours.weight.detach().float().min()) >= 1.05
    master = opt.state[ours.weight]["master"]
    assert torch.equal(ours.weight.detach(), master.to(torch.bfloat16))


def test_step_evaluates_closure_and_returns_loss() -> None:
    p = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = MasterWeightAdamW([p], lr=0.1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (p.float() * 2).sum()
        loss.backward()
        return loss

    assert float(opt.step(closure).detach()) == 8.0
    assert torch.all(p < 1.0)
    assert opt.step() is None  # no closure: the same grads are applied again


@pytest.mark.usefixtures("one_thread")
def test_compiled_falls_back_to_fused_before_touching_anything() -> None:
    """A transposed (non-contiguous) parameter cannot take the flat compiled kernel: the
    optimizer warns, switches to torch's fused kernel and the result is still bitwise
    torch's AdamW; an update applied twice or a step counter advanced twice fails it."""
    g = torch.Generator().manual_seed(0)
    ours = nn.Parameter(torch.randn(16, 8, generator=g).bfloat16().t())
    ref = nn.Parameter(ours.detach().float())
    opt = MasterWeightAdamW([ours], **HYPER, implementation="compiled")
    ref_opt = torch.optim.AdamW([ref], **HYPER, fused=True)
    for step in range(3):
        grad = torch.randn(8, 16, generator=g)
        ours.grad, ref.grad = grad.bfloat16(), grad.bfloat16().float()
        if step == 0:
            with pytest.warns(RuntimeWarning, match="could not run"):
                opt.step()
        else:
            opt.step()
        ref_opt.step()
    assert opt.implementation == "fused"
    assert int(opt.state[ours]["step"]) == 3
    assert torch.equal(opt.state[ours]["master"], ref.detach())
    assert torch.equal(opt.state[ours]["exp_avg_sq"], ref_opt.state[ref]["exp_avg_sq"])
