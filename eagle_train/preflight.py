"""The memory pre-flight of ``train-draft``: before the first step, once the target and the
draft are loaded, the run's peak is estimated from its shapes and settings
(``memory_plan``) and what is still to be allocated is compared with what the device has
(every rank its own; all ranks refuse together). Refused in one line naming the settings
that size memory; ``train.memory_check: false`` skips the refusal, ``train.memory_limit_gib``
compares against a limit of the user's instead of the device's free memory."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from eagle_train.data.loader import PreparedData
from eagle_train.data.packing import default_budget, row_stats
from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.vocab_loss import CHUNK_ELEMENTS, CUDA_CHUNK_ELEMENTS
from eagle_train.errors import UserError
from eagle_train.memory_plan import (
    GIB,
    LayerShape,
    MemoryPlan,
    activation_bytes,
    available_bytes,
    gib,
    loss_chunk_bytes,
    optimizer_bytes,
    target_forward_bytes,
    target_head_bytes,
)
from eagle_train.parallel import DistEnv, any_rank
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget
from eagle_train.target_model.frozen import matmul_upcasts

log = logging.getLogger(__name__)
HELD = ("target weights", "draft weights")


class MemoryCheckError(UserError, RuntimeError):
    pass


def micro_batch_tokens(cfg: RunConfig, data: PreparedData) -> tuple[int, int, int]:
    """(padded tokens, rows, longest row) of the largest training micro-batch the loader can
    make: ``micro_batch_size`` rows padded to the longest (cropped) row, or with packing the
    budget (a row longer than it makes a micro-batch of its own)."""
    lengths = row_stats(data.rows, cfg.data.max_length)[0]
    longest = int(lengths.max()) if len(lengths) else 0
    rows = min(cfg.data.micro_batch_size, len(lengths))
    if not cfg.data.packing:
        return rows * longest, rows, longest
    budget = cfg.data.max_tokens_per_batch or default_budget(cfg.data.micro_batch_size, lengths)
    tokens = max(budget, longest)
    return tokens, int(np.sum(lengths <= tokens)), longest


def _bytes(tensors: Iterable[torch.Tensor], seen: set[int]) -> int:
    """Bytes of the distinct storages of ``tensors`` on this rank (meta tensors hold none)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        if local.is_meta or local.untyped_storage().data_ptr() in seen:
            continue
        seen.add(local.untyped_storage().data_ptr())
        total += local.untyped_storage().nbytes()
    return total


def plan_memory(
    cfg: RunConfig,
    spec: DraftSpec,
    target: FrozenTarget,
    draft: nn.Module,
    data: PreparedData,
    env: DistEnv,
) -> MemoryPlan:
    """The run's peak on one rank, in parts (``memory_plan``), with the components loaded."""
    tokens, rows, longest = micro_batch_tokens(cfg, data)
    desc = target.description
    seen: set[int] = set()
    weights = _bytes([*target.parameters(), *target.buffers()], seen)
    draft_weights = _bytes([*draft.parameters(), *draft.buffers()], seen)
    trainable = [p for p in draft.parameters() if p.requires_grad]
    count = sum(p.numel() for p in trainable)
    storage = trainable[0].element_size() if trainable else 4
    shards = env.world_size if cfg.train.parallel == "fsdp" else 1
    head = getattr(draft, "lm_head", None)
    accumulator = head.weight.numel() * 4 if head is not None and head.weight.requires_grad else 0
    acts = spec.activations(cfg.draft, desc, tokens, rows)
    scored = len(getattr(draft, "d2t", ())) or desc.vocab_size
    chunk = CUDA_CHUNK_ELEMENTS if env.device.type == "cuda" else CHUNK_ELEMENTS
    act_t = torch.finfo(target.dtype).bits // 8
    num_features = len(spec.target_layer_ids(cfg.draft, desc)) + 1
    forward = 0
    if not cfg.data.from_cache:
        layer = LayerShape(
            desc.hidden_size,
            desc.intermediate_size,
            desc.num_heads,
            desc.num_kv_heads,
            desc.head_dim,
        )
        forward = target_forward_bytes(tokens, layer, act_t)
    plan = MemoryPlan(
        parts={
            "target weights": weights,
            "draft weights": draft_weights,
            "optimizer state": optimizer_bytes(count, storage, cfg.optim.fp32_master_weights)
            // shards,
            "gradients": (count * storage + accumulator) // shards,
            "target features": tokens * num_features * desc.hidden_size * act_t,
            "target forward": forward,
            "activations": activation_bytes(acts, tokens, storage),
            "target head": target_head_bytes(
                scored,
                desc.hidden_size,
                act_t,
                subset=scored < desc.vocab_size,
                upcast=matmul_upcasts(env.device.type, target.dtype),
            ),
            "loss chunk": loss_chunk_bytes(acts.units, scored, chunk),
        },
        held=HELD,
        settings=[
            acts.what,
            f"data.max_length={cfg.data.max_length} (rows up to {longest} tokens)",
            f"data.micro_batch_size={cfg.data.micro_batch_size}"
            + (" / data.max_tokens_per_batch (packing)" if cfg.data.packing else ""),
        ],
    )
    return plan


def check_memory(
    cfg: RunConfig,
    spec: DraftSpec,
    target: FrozenTarget,
    draft: nn.Module,
    data: PreparedData,
    env: DistEnv,
) -> MemoryPlan:
    """Log the estimate; refuse (on every rank) when what is still to be allocated exceeds
    what the device has, unless ``train.memory_check`` is off."""
    plan = plan_memory(cfg, spec, target, draft, data, env)
    limit = cfg.train.memory_limit_gib
    free = (
        int(limit * GIB)
        if limit is not None
        else available_bytes(env.device.type, env.device.index)
    )
    where = "train.memory_limit_gib" if limit is not None else f"free on {env.device.type}"
    log.info(
        "memory: about %s at the peak per rank (%s); %s more than loaded now, %s %s",
        *(gib(plan.total), plan.describe(), gib(plan.to_come), gib(free), where),
    )
    over = cfg.train.memory_check and plan.to_come > free
    if any_rank(over, env):
        raise MemoryCheckError(
            f"{', '.join(plan.settings)}: training would need about {gib(plan.total)} per rank at "
            f"its peak ({plan.describe()}), {gib(plan.to_come)} more than is loaded, but "
            f"{gib(free)} is {where}: lower the first of these (activations grow with each), "
            "or set train.memory_check=false to train anyway"
        )
    return plan
