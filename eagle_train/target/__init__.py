"""The frozen target: a HF causal LM and the hidden states drafts are trained on."""

from eagle_train.target.frozen import FrozenTarget, TargetFeatures

__all__ = ["FrozenTarget", "TargetFeatures"]
