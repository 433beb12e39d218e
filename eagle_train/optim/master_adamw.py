"""MasterWeightAdamW: AdamW with fp32 master weights and fp32 moments for a bf16 model.

The model, its gradients, the DDP/FSDP gradient reduction and the exported drafter all
stay in the storage dtype (bf16); only the optimizer holds fp32 (12 bytes per param:
master, exp_avg, exp_avg_sq; fp32 params get no master). See docs/precision.md for why and for the
contract this file implements.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any, cast

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from eagle_train.optim.config import Implementation
from eagle_train.optim.kernels import AdamHyper, CompiledAdamW, UpdateBatch, torch_update

LOW_PRECISION = (torch.bfloat16, torch.float16)
MOMENT_KEYS = ("exp_avg", "exp_avg_sq")


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW whose update runs on fp32 masters; the params are written as ``dtype(master)``.

    ``self.state[p]`` holds ``step``, fp32 ``exp_avg`` / ``exp_avg_sq`` and, for a bf16 or
    fp16 ``p``, an fp32 ``master`` (created from ``p`` at its first step, or at
    ``load_state_dict``). For an FSDP2 DTensor ``p`` they are fp32 DTensors with ``p``'s
    placements, and the kernels run on the local shards.

    The master is the source of truth once created: weights loaded into the model after
    that are overwritten by the next step unless the optimizer state is loaded too (load
    the model first, then the optimizer).

    ``implementation`` picks the kernel (see ``kernels.py``): ``"fused"`` / ``"foreach"``
    run torch's own AdamW on the masters and are bitwise equal to ``torch.optim.AdamW``
    with ``fused=True`` / ``foreach=True`` on an fp32 copy of the model; ``"compiled"`` is a
    single fused pass through ``torch.compile`` (falls back to ``"fused"`` with a warning
    if it cannot compile). ``decoupled_weight_decay=False`` gives Adam with L2 decay.
    AMSGrad, ``maximize``, tensor learning rates and grad scalers are not supported.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        decoupled_weight_decay: bool = True,
        implementation: Implementation = "fused",
    ) -> None:
        _check_hyper(lr, betas, eps, weight_decay)
        if implementation not in ("fused", "foreach", "compiled"):
            raise ValueError(f"unknown implementation {implementation!r}")
        if implementation == "compiled" and not decoupled_weight_decay:
            raise ValueError("implementation='compiled' supports AdamW (decoupled decay) only")
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        super().__init__(params, defaults)
        for p in self._params():
            if p.dtype not in (torch.float32, *LOW_PRECISION):
                raise ValueError(
                    f"MasterWeightAdamW takes float32, bfloat16 or float16 parameters, got {p.dtype}"
                )
        self.implementation: Implementation = implementation
        self._compiled = CompiledAdamW() if implementation == "compiled" else None

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One AdamW step for every param with a gradient; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            batch = self._collect(group)
            if len(batch) == 0:
                continue
            hp = _hyper(group)
            if self._compiled is not None:
                if self._compiled_update(batch, hp):
                    continue
                batch = self._collect(group)  # the fallback moved the step counters
            torch_update(batch, hp, fused=self.implementation != "foreach")
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict without letting torch round master and moments to the param dtype.

        ``Optimizer.load_state_dict`` casts every float state tensor to its param's dtype
        through a class-qualified static method, so overriding that method does nothing.
        Instead the incoming tensors are remembered before ``super().load_state_dict`` and
        put back (as fp32) afterwards. A state written by plain AdamW (no ``master``, bf16
        moments) loads too: moments are upcast, the master is taken from the param, so
        load the model weights first.
        """
        incoming = self._incoming_state(state_dict)
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            _check_loaded_group(group)
        for p in self._params():
            state = self.state.get(p)
            if state:
                self._restore_fp32(p, state, incoming.get(p, {}))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["implementation"] = self.implementation
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Called by deepcopy/unpickling (with "implementation") and by torch's
        # load_state_dict (without): keep the kernel choice and its compiled function.
        implementation = state.pop("implementation", None)
        super().__setstate__(state)
        if implementation is not None:
            self.implementation = implementation
            self._compiled = CompiledAdamW() if implementation == "compiled" else None

    # -- internals ---------------------------------------------------------------------

    def _params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _collect(self, group: dict[str, Any]) -> UpdateBatch:
        batch = UpdateBatch([], [], [], [], [], [])
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError("MasterWeightAdamW does not support sparse gradients")
            state = self.state[p]
            if not state:
                self._init_state(p, state)
            master = state.get("master")
            batch.masters.append(_local(p if master is None else master))
            batch.grads.append(_local(p.grad))
            batch.exp_avgs.append(_local(state["exp_avg"]))
            batch.exp_avg_sqs.append(_local(state["exp_avg_sq"]))
            batch.steps.append(state["step"])
            batch.params.append(None if master is None else _local(p))
        return batch

    def _init_state(self, p: Tensor, state: dict[str, Any]) -> None:
        state["step"] = torch.zeros((), dtype=torch.float32, device=self._step_device(p))
        if p.dtype != torch.float32:
            state["master"] = p.detach().to(torch.float32)
        for key in MOMENT_KEYS:
            state[key] = torch.zeros_like(
                p, dtype=torch.float32, memory_format=torch.preserve_format
            )

    def _step_device(self, p: Tensor) -> torch.device:
        # torch's fused kernel reads the step counter on the param's device; the other
        # paths read it on the host (as torch does), which avoids a device sync per step.
        return p.device if self.implementation == "fused" else torch.device("cpu")

    def _compiled_update(self, batch: UpdateBatch, hp: AdamHyper) -> bool:
        assert self._compiled is not None
        try:
            self._compiled.update(batch, hp)
        except Exception as exc:  # a compiler failure, a non-contiguous tensor: torch's kernel
            warnings.warn(
                f"MasterWeightAdamW: implementation='compiled' could not run ({exc!r}); "
                "falling back to implementation='fused'",
                RuntimeWarning,
                stacklevel=3,
            )
            self._compiled = None
            self.implementation = "fused"
            for state in self.state.values():
                if "step" in state:
                    state["step"] = state["step"].to(self._step_device(state["exp_avg"]))
            return False
        return True

    def _incoming_state(self, state_dict: dict[str, Any]) -> dict[Tensor, dict[str, Tensor]]:
        """Map each of our params to the float tensors its saved state holds (uncast)."""
        saved_ids = chain.from_iterable(g["params"] for g in state_dict.get("param_groups", []))
        id_to_param = dict(zip(saved_ids, self._params(), strict=False))
        out: dict[Tensor, dict[str, Tensor]] = {}
        for key, value in state_dict.get("state", {}).items():
            if key in id_to_param and isinstance(value, dict):
                tensors = {k: v for k, v in value.items() if torch.is_tensor(v) and k != "step"}
                out[id_to_param[key]] = tensors
        return out

    def _restore_fp32(self, p: Tensor, state: dict[str, Any], saved: dict[str, Tensor]) -> None:
        for key in MOMENT_KEYS:
            if key not in saved:
                raise ValueError(f"optimizer state of a {tuple(p.shape)} parameter lacks {key!r}")
            state[key] = _as_fp32_state(saved[key], p, key)
        if p.dtype == torch.float32:
            state.pop("master", None)  # the fp32 param is its own master
        elif "master" in saved:
            state["master"] = _as_fp32_state(saved["master"], p, "master")
        else:
            state["master"] = p.detach().to(torch.float32)  # a plain-AdamW state
        step = state["step"]
        if not torch.is_tensor(step):
            step = torch.tensor(float(step))
        state["step"] = step.to(dtype=torch.float32, device=self._step_device(p))


def _local(t: Tensor) -> Tensor:
    """The tensor the kernels update in place: itself, or a DTensor's local shard."""
    return t.to_local() if isinstance(t, DTensor) else t


def _as_fp32_state(value: Tensor, p: Tensor, key: str) -> Tensor:
    if isinstance(p, DTensor) != isinstance(value, DTensor):
        raise ValueError(
            f"optimizer state {key!r} of a {tuple(p.shape)} parameter is "
            f"{'a DTensor' if isinstance(value, DTensor) else 'a plain tensor'} but the "
            "parameter is not; load sharded state through torch.distributed.checkpoint"
        )
    if tuple(value.shape) != tuple(p.shape):
        raise ValueError(
            f"optimizer state {key!r} has shape {tuple(value.shape)}, parameter {tuple(p.shape)}"
        )
    if isinstance(value, DTensor):
        return value.to(dtype=torch.float32)
    return value.to(device=p.device, dtype=torch.float32)


def _hyper(group: dict[str, Any]) -> AdamHyper:
    lr = group["lr"]
    if torch.is_tensor(lr):
        raise ValueError("MasterWeightAdamW takes a float learning rate, not a tensor")
    beta1, beta2 = group["betas"]
    return AdamHyper(
        lr=float(lr),
        beta1=float(beta1),
        beta2=float(beta2),
        eps=float(group["eps"]),
        weight_decay=float(group["weight_decay"]),
        decoupled=bool(group.get("decoupled_weight_decay", True)),
    )


def _check_hyper(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if torch.is_tensor(lr) or not lr >= 0.0:
        raise ValueError(f"lr must be a float >= 0, got {lr!r}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must be two floats in [0, 1), got {betas!r}")
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if not weight_decay >= 0.0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")


def _check_loaded_group(group: dict[str, Any]) -> None:
    """A loaded group may come from torch's AdamW: refuse settings we do not implement."""
    for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
        if group.get(flag):
            raise ValueError(
                f"loaded optimizer state uses {flag}=True, which MasterWeightAdamW lacks"
            )
    group.setdefault("decoupled_weight_decay", True)
    _check_hyper(
        group["lr"],
        cast(tuple[float, float], tuple(group["betas"])),
        group["eps"],
        group["weight_decay"],
    )
