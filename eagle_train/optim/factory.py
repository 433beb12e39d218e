"""create_optimizer: the only way the trainer builds its optimizer; resolve_storage_dtype.

Parameter groups: weight decay applies to weight matrices only. Norm gains, biases,
embeddings and any parameter with fewer than 2 dims are not decayed; frozen parameters
(``requires_grad=False``) are left out entirely.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from eagle_train.optim.config import OptimConfig
from eagle_train.optim.master_adamw import MasterWeightAdamW

STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
OPT_OUT = "optim.fp32_master_weights=false"


def create_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """Build the run's optimizer over ``model``'s trainable parameters.

    AdamW, as every peer trains drafts. With ``cfg.fp32_master_weights`` (the default) this
    is a ``MasterWeightAdamW``; with the flag off torch's AdamW trains the params in their own
    dtype.
    """
    groups = build_param_groups(model, cfg.weight_decay)
    if cfg.fp32_master_weights:
        return MasterWeightAdamW(
            groups,
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            implementation=cfg.kernel(),
        )
    if cfg.kernel() == "compiled":
        raise ValueError(
            f"optim.implementation=compiled exists for fp32 master weights only; with {OPT_OUT} "
            "use optim.implementation=fused or foreach"
        )
    kernel = {"fused": True} if cfg.kernel() == "fused" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kernel)


def build_param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """``[{decayed params, weight_decay}, {not decayed, weight_decay=0}]``, in this order, an
    empty group left out; params are ``(name, param)`` pairs so the state dict names them."""
    no_decay_ids = {id(p) for _, p in _no_decay_params(model)}
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():  # shared (tied) params are yielded once
        if not p.requires_grad:
            continue
        (no_decay if id(p) in no_decay_ids else decay).append((name, p))
    if not decay and not no_decay:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # torch refuses an empty group next to a named one; the layout is still fixed per model.
    return [g for g in groups if g["params"]]


def _no_decay_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Norm gains/biases, embeddings, biases and every param with fewer than 2 dims."""
    out = []
    for module_name, module in model.named_modules():
        # By type name, so HF's LlamaRMSNorm / Qwen3RMSNorm count without importing them.
        exempt_module = isinstance(module, nn.Embedding) or "Norm" in type(module).__name__
        for param_name, p in module.named_parameters(recurse=False):
            full_name = f"{module_name}.{param_name}" if module_name else param_name
            if exempt_module or p.ndim < 2 or param_name == "bias":
                out.append((full_name, p))
    return out


def resolve_storage_dtype(target_dtype: torch.dtype, cfg: OptimConfig) -> torch.dtype:
    """The dtype the draft's parameters live in during training.

    - ``cfg.dtype`` set explicitly: that dtype (an fp32 draft then gets no masters).
    - ``"auto"`` with ``fp32_master_weights`` on (default): the target's dtype; the
      optimizer holds fp32 masters and moments (16 bytes/param resident).
    - ``"auto"`` with the flag off: the target's dtype with no fp32 anywhere (8 bytes/param):
      the documented low-memory, lower-quality opt-out.
    """
    if not target_dtype.is_floating_point:
        raise ValueError(f"target dtype must be a floating point dtype, got {target_dtype}")
    if cfg.dtype != "auto":
        return STORAGE_DTYPES[cfg.dtype]
    return target_dtype
