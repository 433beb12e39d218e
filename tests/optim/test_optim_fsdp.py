"""MasterWeightAdamW on FSDP2 (fully_shard) DTensor params: 2 gloo processes on CPU."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from optim_helpers import TinyDraft, free_port, tiny_loss
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from eagle_train.optim import OptimConfig, create_optimizer, find_precision_problems

WORLD = 2
STEPS = 3


def _check_sharded_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.to_local().dtype == torch.bfloat16, name
        state = opt.state[p]
        for key in ("master", "exp_avg", "exp_avg_sq"):
            value = state[key]
            assert isinstance(value, DTensor), (name, key)
            assert value.placements == p.placements, (name, key)
            assert value.dtype == torch.float32 and value.to_local().dtype == torch.float32
            assert value.to_local().shape == p.to_local().shape
    assert find_precision_problems(opt) == []


def _run(implementation: str) -> None:
    torch.manual_seed(0)
    model = TinyDraft()
    reference = copy.deepcopy(model)  # unsharded, same init, same batches
    fully_shard(model)
    cfg = OptimConfig(lr=1e-2, implementation=implementation)
    opt, ref_opt = create_optimizer(model, cfg), create_optimizer(reference, cfg)
    for step in range(STEPS):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            tiny_loss(m, seed=step).backward()  # same batch on every rank
            o.step()
    _check_sharded_state(model, opt)
    # Each rank feeds the same batch, so the bf16 gradient average is exact and the sharded
    # run can match the unsharded one bitwise.
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.full_tensor(), q.detach()), name
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][key].full_tensor(), ref_opt.state[q][key]), (name, key)

    # Resume on the same mesh: the sharded fp32 state survives load_state_dict.
    resumed = create_optimizer(model, cfg)
    resumed.load_state_dict(opt.state_dict())
    _check_sharded_state(model, resumed)


def _worker(rank: int, port: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        for implementation in ("fused", "foreach", "compiled"):
            _run(implementation)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_fsdp2_state_is_fp32_dtensors_and_matches_unsharded() -> None:
    mp.spawn(_worker, args=(free_port(),), nprocs=WORLD, join=True)
