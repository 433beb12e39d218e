"""EAGLE-1 draft config (every default lives here)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eagle_train.drafts.draft_config import DraftConfigBase, VocabLossChoice


class Eagle1Config(DraftConfigBase, VocabLossChoice):
    algorithm: Literal["eagle1"] = "eagle1"
    # Llama decoder layers after fc (layer 0 has no input_layernorm, as vLLM builds it).
    num_layers: int = Field(default=1, ge=1)
    # Loss = feature_weight * SmoothL1(f_hat, f) + logit_weight * soft-CE over the target head.
    feature_weight: float = Field(default=1.0, ge=0)
    logit_weight: float = Field(default=0.1, ge=0)
    # Half-width of uniform noise added to the input feature f_t while training (0 = off).
    # On by default (the paper's 0.1): in serving the draft chains on its own, imperfect
    # features, and the noise teaches it to tolerate them.
    feature_noise: float = Field(default=0.1, ge=0)
    # Tokens drafted per step when served (vLLM num_speculative_tokens); recorded in the export.
    num_speculative_tokens: int = Field(default=3, ge=1)
    # Training-time-test attention kernel: chunked (exact fp32 reference), fused (CPU: torch's
    # flash kernel + the chain keys merged by log-sum-exp), flex (CUDA: compiled
    # flex_attention with a block mask); auto = flex on CUDA, fused on CPU.
    attention: Literal["auto", "chunked", "fused", "flex"] = "auto"
