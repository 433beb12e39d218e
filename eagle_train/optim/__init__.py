"""The optimizer side of training: fp32 master-weight AdamW, its factory, guard and schedule.

The trainer builds its optimizer only with ``create_optimizer(model, cfg.optim)``, places
the draft in ``resolve_storage_dtype(target_dtype, cfg.optim)``, and calls
``PrecisionGuard.after_step`` after each optimizer step.
"""

from eagle_train.optim.config import OptimConfig
from eagle_train.optim.factory import build_param_groups, create_optimizer, resolve_storage_dtype
from eagle_train.optim.guard import PrecisionError, PrecisionGuard, find_precision_problems
from eagle_train.optim.master_adamw import MasterWeightAdamW
from eagle_train.optim.schedule import build_lr_scheduler

__all__ = [
    "MasterWeightAdamW",
    "OptimConfig",
    "PrecisionError",
    "PrecisionGuard",
    "build_lr_scheduler",
    "build_param_groups",
    "create_optimizer",
    "find_precision_problems",
    "resolve_storage_dtype",
]
