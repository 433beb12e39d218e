"""Data parallelism from outside the model: torchrun's environment, DDP or FSDP2, full
state dicts for checkpoints, and the few collectives the loop needs. The draft stays a single-device module; this file is the only
place that knows about process groups, and it keeps no globals (``DistEnv`` is passed).

Launch: ``torchrun --nproc-per-node N -m eagle_train.cli ...`` or ``scripts/launch.sh``
(multi-node: the same command with torchrun's ``--nnodes/--rdzv-*`` flags). gloo on CPU,
NCCL on GPU. When one rank raises, its process exits non-zero and torchrun's agent stops
the others at once; without an agent, a peer blocked in a collective gets gloo's
"connection closed" error or NCCL's watchdog abort after ``timeout``.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from eagle_train.errors import UserError

Strategy = Literal["ddp", "fsdp"]


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


class DeviceError(UserError, RuntimeError):
    """A device this process cannot use (one line, exit 2)."""


def die_with_launcher(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent (torchrun's agent) dies, so
    a killed launcher leaves no rank running (and holding the run lock). SIGTERM is the
    preemption notice: a training rank saves a checkpoint at the end of its step and exits;
    a second signal, or any other command, stops at once. Elsewhere: nothing."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, sig)
    if os.getppid() != parent:  # the launcher died while the signal was being armed
        os.kill(os.getpid(), sig)


def init_distributed(device: str, timeout_s: float) -> DistEnv:
    """Join torchrun's process group when launched by it (``WORLD_SIZE`` > 1), else a
    single process. ``device`` is ``auto``, ``cpu`` or ``cuda``; each rank gets
    ``cuda:LOCAL_RANK`` on GPU machines. A rank torchrun started dies with it."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        die_with_launcher()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if kind not in ("cpu", "cuda"):
        raise DeviceError(f"train.device {device!r}: expected auto, cpu or cuda")
    if kind == "cuda" and local_rank >= torch.cuda.device_count():
        raise DeviceError(
            f"train.device cuda: this process sees {torch.cuda.device_count()} CUDA device(s) "
            f"(torch {torch.__version__}), rank {local_rank} needs one: use cpu or auto"
        )
    dev = torch.device(kind, local_rank) if kind == "cuda" else torch.device(kind)
    if kind == "cuda":
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if kind == "cuda" else "gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if kind == "cuda" else None,
        )
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def shutdown(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, env: DistEnv, strategy: Strategy = "ddp") -> nn.Module:
    """``ddp``: a replica per rank (buffers such as vocab maps are identical on every rank
    by construction, so they are not re-broadcast at every forward). ``fsdp``: FSDP2 over
    the whole draft as one unit, for drafts whose fp32 optimizer state does not fit once per
    GPU: parameters, gradients, fp32 masters and moments are sharded (16 B per parameter
    spread over the ranks) and the bf16 weights are gathered for each forward and backward
    (2 B per parameter). One unit, because draft forwards call their layers' parts directly
    (TTT steps), which per-layer units would not see. ``model`` is sharded in place: build
    the optimizer after this."""
    if not env.distributed:
        return model
    if strategy == "fsdp":
        fully_shard(model)
        return model
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, forward_sync_buffers=False)


def gradient_sync(model: nn.Module, sync: bool):
    """Context for one forward+backward: gradients are reduced over ranks only when
    ``sync`` (the last backward before an optimizer step)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)
        return nullcontext()
    if sync or not isinstance(model, DistributedDataParallel):
        return nullcontext()
    return model.no_sync()


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded model state on CPU, keyed by parameter name, whatever the wrapping (so a
    checkpoint resumes under DDP, FSDP2 or one process alike). A collective under FSDP2:
    every rank calls it; only rank 0 gets the values."""
    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=_FULL))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state in the same form: keyed by parameter name, unsharded, on CPU."""
    return get_optimizer_state_dict(model, optimizer, options=_FULL)


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
) -> None:
    """The inverse of ``full_model_state`` and ``full_optimizer_state``: every rank passes
    the same full state. Weights are
    loaded first, so the optimizer's fp32 masters are then restored over them."""
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


def local_value(t: torch.Tensor) -> float:
    """A scalar that may be a DTensor (e.g. a gradient norm under FSDP2)."""
    return float(t.full_tensor() if isinstance(t, DTensor) else t)


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Elementwise sum over ranks (float64 or int64 tensor on CPU; moved for NCCL)."""
    if not env.distributed:
        return values
    moved = values.to(env.device)
    dist.all_reduce(moved, op=dist.ReduceOp.SUM)
    return moved.to(values.device)


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every rank when ``flag`` is true on at least one."""
    return bool(all_reduce_sum(torch.tensor([int(flag)], dtype=torch.int64), env).item())


def gather_objects(obj: Any, env: DistEnv) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()
