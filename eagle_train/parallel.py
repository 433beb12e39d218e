"""Data parallelism from outside the model: torchrun's environment, DDP, and the few
collectives the loop needs. The draft stays a single-device module; this file is the only
place that knows about process groups, and it keeps no globals (``DistEnv`` is passed).

Launch: ``torchrun --nproc-per-node N -m eagle_train.cli ...`` or ``scripts/launch.sh``
(multi-node: the same command with torchrun's ``--nnodes/--rdzv-*`` flags). gloo on CPU,
NCCL on GPU. When one rank raises, its process exits non-zero and torchrun's agent stops
the others at once; without an agent, a peer blocked in a collective gets gloo's
"connection closed" error or NCCL's watchdog abort after ``timeout``.
"""

from __future__ import annotations

import datetime
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


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


def init_distributed(device: str, timeout_s: float) -> DistEnv:
    """Join torchrun's process group when launched by it (``WORLD_SIZE`` > 1), else a
    single process. ``device`` is ``auto``, ``cpu`` or ``cuda``; each rank gets
    ``cuda:LOCAL_RANK`` on GPU machines."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    kind = torch.device(kind).type
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


def wrap_model(model: nn.Module, env: DistEnv) -> nn.Module:
    """DDP over the trainable parameters. Buffers (vocab maps) are identical on every rank
    by construction, so they are not re-broadcast at every forward."""
    if not env.distributed:
        return model
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, forward_sync_buffers=False)


def gradient_sync(model: nn.Module, sync: bool):
    """Context for one forward+backward: DDP reduces gradients only when ``sync``."""
    if sync or not isinstance(model, DistributedDataParallel):
        return nullcontext()
    return model.no_sync()


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

