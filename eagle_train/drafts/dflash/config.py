"""DFlash draft config (every default lives here)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eagle_train.config import StrictModel


class DFlashConfig(StrictModel):
    algorithm: Literal["dflash"] = "dflash"
    # Block = [anchor, MASK x (B-1)]; vLLM serves it with num_speculative_tokens = B-1.
    block_size: int = Field(default=16, ge=2)
    # Draft decoder layers (Qwen3-style). 5 for large targets, 1-2 for tiny ones.
    num_layers: int = Field(default=5, ge=1)
    # How many target layers feed the context (n). Ignored when target_layer_ids is set.
    num_target_features: int = Field(default=5, ge=1)
    # 0-based target layer OUTPUTS (DFlash's/vLLM dflash_config convention; vLLM reads the
    # hidden after id+1 layers). None -> round(1 + i*(L-4)/(n-1)), which collides on
    # targets with fewer than ~n+4 layers: set it explicitly there.
    target_layer_ids: list[int] | None = None
    # Id of the mask token in the TARGET vocabulary (its frozen embedding row fills the
    # block). None -> the target tokenizer's mask_token.
    mask_token_id: int | None = Field(default=None, ge=0)
    # Anchors (blocks) sampled per sequence and step, among positions whose first drafted
    # token is supervised; each slot is then weighted by its own loss mask.
    num_anchors: int = Field(default=512, ge=1)
    # Slot k (1..B-1) weighs exp(-(k-1)/gamma). None -> 7 for B=16, 5 for B=10, 4 for B=8,
    # linear between those points and extended by the nearest segment elsewhere (>= 1).
    loss_gamma: float | None = Field(default=None, gt=0)
    # hard: cross-entropy to the data token x_{a+k}; distill: soft cross-entropy to the
    # target's distribution at a+k-1. auto (train-draft resolves it from the training data's
    # meta.json and saves the choice): hard when prepare-data regenerated the answers with the
    # target, distill when the answers are the dataset's own. Measured on the demo target
    # (README): hard beat distill on regenerated data, distill beat hard on raw data.
    loss_target: Literal["auto", "hard", "distill"] = "auto"
    # Block attention kernel: chunked (exact fp32 reference), flex (CUDA: compiled
    # flex_attention with a block mask); auto = flex on CUDA, chunked elsewhere.
    attention: Literal["auto", "chunked", "flex"] = "auto"
