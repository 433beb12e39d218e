"""PrecisionGuard: fail the first optimizer step of a run that would silently train in bf16.

Usage in the training loop (after every ``optimizer.step()``)::

    guard = PrecisionGuard(enabled=cfg.optim.fp32_master_weights)
    for step in range(start_step, num_steps + 1):
        ...
        optimizer.step()
        guard.after_step(optimizer, step)

The first call inspects the optimizer state (once per run, so also at the first step of a
resumed run) and raises ``PrecisionError`` if a trainable parameter's optimizer moments
are not fp32 or a bf16/fp16 parameter has no fp32 master, i.e. the loop built its
optimizer without ``create_optimizer``. Every later call returns at once. The guard is
disabled only by the explicit opt-out ``optim.fp32_master_weights=false``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

LOW_PRECISION = (torch.bfloat16, torch.float16)
MAX_LISTED = 8


class PrecisionError(RuntimeError):
    """The optimizer does not keep fp32 state for a trainable parameter."""


class PrecisionGuard:
    """Checks the fp32 precision contract once, at the first optimizer step it observes."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.verified_at_step: int | None = None

    def after_step(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Call right after ``optimizer.step()``; ``step`` is the loop's step number (>= 1)."""
        if not self.enabled or self.verified_at_step is not None:
            return
        problems = find_precision_problems(optimizer)
        if problems:
            listed = "\n  ".join(problems[:MAX_LISTED])
            more = (
                f"\n  ... and {len(problems) - MAX_LISTED} more"
                if len(problems) > MAX_LISTED
                else ""
            )
            raise PrecisionError(
                f"optimizer precision check failed at step {step} (the first step this run "
                f"observed): {type(optimizer).__name__} does not keep fp32 state for every "
                f"trainable parameter:\n  {listed}{more}\n"
                "Build the optimizer with eagle_train.optim.create_optimizer(model, cfg.optim). "
                "A deliberate low-precision run opts out with optim.fp32_master_weights=false "
                "(and PrecisionGuard(enabled=cfg.optim.fp32_master_weights))."
            )
        self.verified_at_step = step


def find_precision_problems(optimizer: torch.optim.Optimizer) -> list[str]:
    """One line per violation of the contract; empty when every trainable param is fp32-backed."""
    problems: list[str] = []
    for gi, group in enumerate(optimizer.param_groups):
        names = group.get("param_names")
        for pi, p in enumerate(group["params"]):
            if not p.requires_grad:
                continue
            name = names[pi] if names else f"param_groups[{gi}][{pi}] {tuple(p.shape)}"
            problems.extend(_param_problems(name, p, optimizer.state.get(p, {})))
    return problems


def _param_problems(name: str, p: Tensor, state: dict[str, Any]) -> list[str]:
    if not state:
        # A param that has never had a gradient has no state yet under any optimizer.
        return [f"{name}: has a gradient but no optimizer state"] if p.grad is not None else []
    out = []
    float_state = {
        k: v
        for k, v in state.items()
        if k != "step" and torch.is_tensor(v) and v.is_floating_point()
    }
    for key, value in float_state.items():
        if _local_dtype(value) != torch.float32:
            out.append(f"{name}: optimizer state {key!r} is {_local_dtype(value)}, not float32")
    if _local_dtype(p) in LOW_PRECISION:
        master = state.get("master")
        if not torch.is_tensor(master):
            out.append(f"{name}: {_local_dtype(p)} parameter has no fp32 master copy")
        elif isinstance(p, DTensor) and (
            not isinstance(master, DTensor) or master.placements != p.placements
        ):
            out.append(f"{name}: master is not a DTensor with the parameter's placements")
        elif tuple(master.shape) != tuple(p.shape):
            out.append(f"{name}: master shape {tuple(master.shape)} != param {tuple(p.shape)}")
    elif not float_state and p.grad is not None:
        out.append(f"{name}: optimizer keeps no moments for this parameter")
    return out


def _local_dtype(t: Tensor) -> torch.dtype:
    # A DTensor's own dtype can disagree with its local shard (the p.data-swap trap):
    # the shard is what the kernels actually compute with.
    return t.to_local().dtype if isinstance(t, DTensor) else t.dtype
