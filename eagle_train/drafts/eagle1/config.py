"""EAGLE-1 draft config (every default lives here)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eagle_train.drafts.draft_config import MAX_DRAFT_DEPTH, DraftConfigBase, VocabLossChoice


class Eagle1Config(DraftConfigBase, VocabLossChoice):
    algorithm: Literal["eagle1"] = "eagle1"
    """The draft algorithm: eagle1, eagle3, peagle or dflash (docs/algorithms/); it picks which
    draft.* settings exist."""
    num_layers: int = Field(default=1, ge=1, le=MAX_DRAFT_DEPTH)
    """Llama decoder layers after fc (layer 0 has no input_layernorm, as vLLM builds it)."""
    feature_weight: float = Field(default=1.0, ge=0)
    """Weight of the feature regression: loss = feature_weight x SmoothL1(f_hat, f) +
    logit_weight x soft cross-entropy through the target's head."""
    logit_weight: float = Field(default=0.1, ge=0)
    """Weight of the soft cross-entropy through the frozen target head (the paper's 0.1)."""
    feature_noise: float = Field(default=0.1, ge=0)
    """Half-width of uniform noise added to the input feature f_t while training (0 = off). On
    by default (the paper's 0.1): in serving the draft chains on its own, imperfect features,
    and the noise teaches it to tolerate them."""
    num_speculative_tokens: int = Field(default=3, ge=1, le=MAX_DRAFT_DEPTH)
    """Tokens drafted per step when served (vLLM num_speculative_tokens); recorded in the
    export."""
    attention: Literal["auto", "chunked", "fused", "flex"] = "auto"
    """Training-time-test attention kernel: chunked (exact fp32 reference), fused (CPU: torch's
    flash kernel + the chain keys merged by log-sum-exp), flex (CUDA: compiled flex_attention
    with a block mask); auto = flex on CUDA, fused on CPU."""
