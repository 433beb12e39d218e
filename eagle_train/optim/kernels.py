"""AdamW update kernels that run on fp32 masters while the model stays bf16.

Two kinds of path, both vectorised, both updating plain (local) tensors in place:

- ``torch_update``: torch's own functional Adam (``fused=True`` or ``foreach=True``) on the
  fp32 masters with fp32 copies of the gradients, then one ``_foreach_copy_`` of the
  masters into the low-precision params. The arithmetic IS torch's, so master and moments
  are bitwise equal to ``torch.optim.AdamW`` with the same kernel on an fp32 model. Cost:
  two extra passes (grad cast, param copy-back), ~40 bytes moved per param instead of 28.
- ``CompiledAdamW``: one ``torch.compile`` d elementwise pass that reads the bf16 gradient
  and writes the bf16 param itself (28 bytes per param, the floor), one call per parameter
  group (a multi-tensor kernel). Its rounding
  follows torch's fused CPU AdamW vector loop step by step, FMAs included, so on CPU it is
  bitwise equal to ``AdamW(fused=True)`` except on the last ``numel % 16`` elements of a
  tensor, which torch's kernel handles in a scalar loop with another FMA placement (one
  float32 ulp apart per step). On CUDA (Triton) its arithmetic is unverified here.

A "local tensor" is the tensor itself, or the local shard of an FSDP2 DTensor: AdamW is
elementwise, so updating shards in place is the same arithmetic as updating the whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.optim.adam import adam as torch_adam

# Contraction lets the C++ compiler emit the FMAs torch's CPU kernel rounds through; see
# _adamw_kernel for how the products that must stay rounded are kept out of it.
COMPILE_OPTIONS = {"cpp.enable_floating_point_contract_flag": "fast"}


@dataclass(frozen=True)
class AdamHyper:
    """Hyperparameters of one parameter group, as plain floats."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    decoupled: bool


@dataclass
class UpdateBatch:
    """The local tensors one group's update touches; lists are aligned by index.

    ``masters[i]`` is the fp32 tensor the update runs on (the param itself when it is
    fp32); ``params[i]`` is the low-precision param that receives ``master`` after the
    update, or None for an fp32 param.
    """

    masters: list[Tensor]
    grads: list[Tensor]
    exp_avgs: list[Tensor]
    exp_avg_sqs: list[Tensor]
    steps: list[Tensor]
    params: list[Tensor | None]

    def __len__(self) -> int:
        return len(self.masters)


def torch_update(batch: UpdateBatch, hp: AdamHyper, *, fused: bool) -> None:
    """One AdamW step through torch's own kernel on the fp32 masters (bit-exact vs torch)."""
    # fp32 copies of the grads live only inside the step: the model's grads (and so the
    # DDP/FSDP all-reduce) stay bf16, and the peak is +4 bytes per param.
    grads32 = [g if g.dtype == torch.float32 else g.to(torch.float32) for g in batch.grads]
    torch_adam(
        batch.masters,
        grads32,
        batch.exp_avgs,
        batch.exp_avg_sqs,
        [],
        batch.steps,
        foreach=not fused,
        fused=fused,
        capturable=False,
        differentiable=False,
        grad_scale=None,
        found_inf=None,
        has_complex=False,
        decoupled_weight_decay=hp.decoupled,
        amsgrad=False,
        beta1=hp.beta1,
        beta2=hp.beta2,
        lr=hp.lr,
        weight_decay=hp.weight_decay,
        eps=hp.eps,
        maximize=False,
    )
    del grads32
    write_back(batch)


def write_back(batch: UpdateBatch) -> None:
    """param <- param_dtype(master) for every low-precision param of the batch."""
    pairs = [(p, m) for p, m in zip(batch.params, batch.masters, strict=True) if p is not None]
    if pairs:
        torch._foreach_copy_([p for p, _ in pairs], [m for _, m in pairs])


def _adamw_kernel(
    master: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    param: Tensor | None,
    scalars: Tensor,
) -> None:
    """One decoupled-weight-decay Adam step on 1-D tensors, in place (compiled, not eager).

    The float32 roundings are those of torch's fused CPU AdamW vector loop:
    ``decayed = master * decay`` (rounded), ``exp_avg = fma(coeff, g - exp_avg, base)``,
    ``exp_avg_sq = fma((1 - beta2) * g, g, exp_avg_sq * beta2)``,
    ``denom = sqrt(exp_avg_sq) / sqrt(bias_correction2) + eps``,
    ``master = decayed + (-step_size * exp_avg) / denom``.

    Inductor's C++ backend has no FMA op, so the kernel is compiled with floating-point
    contraction on (``COMPILE_OPTIONS``): the compiler may then fuse any product that only
    feeds an add, and picks which one by itself. The two products torch rounds on their
    own (``master * decay`` and ``exp_avg_sq * beta2``; GCC 12 does fuse the latter if
    left bare) therefore pass through ``where(x == x, product, x)``, a per-element select
    the compiler cannot fold (``x == x`` is false only for NaN, where both arms are NaN)
    and that stops the contraction. ``scalars`` comes from ``step_scalars`` (float32, on
    the tensors' device, so no recompile per step).
    """
    g = grad.to(torch.float32)
    decayed = torch.where(master == master, master * scalars[0], master)
    base = torch.where(scalars[2] > 0, exp_avg, g)
    new_avg = base + scalars[1] * (g - exp_avg)  # -> fma
    avg_sq_decayed = torch.where(exp_avg_sq == exp_avg_sq, exp_avg_sq * scalars[3], exp_avg_sq)
    new_avg_sq = avg_sq_decayed + (scalars[4] * g) * g  # -> fma((1 - beta2) * g, g, .)
    denom = new_avg_sq.sqrt() / scalars[5] + scalars[6]
    new_master = decayed + (scalars[7] * new_avg) / denom
    exp_avg.copy_(new_avg)
    exp_avg_sq.copy_(new_avg_sq)
    master.copy_(new_master)
    if param is not None:
        param.copy_(new_master)


def step_scalars(hp: AdamHyper, step: float, device: torch.device) -> Tensor:
    """The per-step float32 constants of ``_adamw_kernel``, computed as torch's kernel does.

    Bias corrections and the step size are computed in float64 (``pow``, ``sqrt``) and
    rounded to float32 once, exactly like ``adam_fused_step_impl``.
    """
    weight = float(torch.tensor(1.0 - hp.beta1, dtype=torch.float32))
    lerp_from_avg = abs(weight) < 0.5
    # For large weights torch's lerp uses end - (1 - w) * (end - start): coeff w - 1
    # (exact in float32 for w in [0.5, 1)) with base = the gradient.
    coeff = weight if lerp_from_avg else weight - 1.0
    bias_correction1 = 1.0 - hp.beta1**step
    bias_correction2 = 1.0 - hp.beta2**step
    values = [
        1.0 - hp.lr * hp.weight_decay,
        coeff,
        1.0 if lerp_from_avg else 0.0,
        hp.beta2,
        1.0 - hp.beta2,
        math.sqrt(bias_correction2),
        hp.eps,
        -(hp.lr / bias_correction1),
    ]
    return torch.tensor(values, dtype=torch.float32, device=device)


def _adamw_multi(
    masters: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    params: list[Tensor | None],
    scalars: Tensor,
) -> None:
    """``_adamw_kernel`` over lists of tensors: traced into one graph, so one call updates a
    whole parameter group (small tensors pay no per-tensor call and guard overhead)."""
    for i in range(len(masters)):
        _adamw_kernel(masters[i], grads[i], exp_avgs[i], exp_avg_sqs[i], params[i], scalars)


class CompiledAdamW:
    """The single-pass update: one compiled multi-tensor call per parameter group and step.

    Compiled lazily for the group's list of tensor shapes (a model's groups are fixed, so
    once per group). A compiler failure raises before any tensor is written (the step
    counters are advanced only after the update), so the caller can fall back.
    """

    def __init__(self) -> None:
        self._kernel = torch.compile(
            _adamw_multi, dynamic=False, fullgraph=True, options=COMPILE_OPTIONS
        )

    def update(self, batch: UpdateBatch, hp: AdamHyper) -> None:
        if not hp.decoupled:
            raise ValueError("the compiled AdamW kernel implements decoupled weight decay only")
        by_step: dict[tuple[torch.device, float], list[int]] = {}
        for i in range(len(batch)):  # params of one group normally share their step
            key = (batch.masters[i].device, float(batch.steps[i]) + 1.0)
            by_step.setdefault(key, []).append(i)
        for (device, step), idx in by_step.items():
            params = [batch.params[i] for i in idx]
            self._kernel(
                [_flat(batch.masters[i]) for i in idx],
                [_flat(batch.grads[i]) for i in idx],
                [_flat(batch.exp_avgs[i]) for i in idx],
                [_flat(batch.exp_avg_sqs[i]) for i in idx],
                [None if p is None else _flat(p) for p in params],
                step_scalars(hp, step, device),
            )
            for i in idx:
                batch.steps[i].add_(1.0)


def _flat(t: Tensor) -> Tensor:
    if not t.is_contiguous():
        raise ValueError(
            "implementation='compiled' needs contiguous parameters, gradients and state; "
            "use optim.implementation=fused for this model"
        )
    return t.view(-1)
