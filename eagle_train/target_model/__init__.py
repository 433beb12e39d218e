"""The frozen target: a HF causal LM, the hidden states drafts read, and the one description
of it (geometry, RoPE, norms, captured layers, what vLLM serves) every draft receives."""

from eagle_train.target_model.description import (
    Rope,
    TargetDescription,
    TargetError,
    describe_target,
    load_target_description,
)
from eagle_train.target_model.frozen import FrozenTarget, TargetFeatures

__all__ = [
    "FrozenTarget",
    "Rope",
    "TargetDescription",
    "TargetError",
    "TargetFeatures",
    "describe_target",
    "load_target_description",
]
