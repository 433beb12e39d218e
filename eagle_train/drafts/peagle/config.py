"""P-EAGLE draft config (every default lives here)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from eagle_train.config import SettingError, refuse_moved_key
from eagle_train.drafts.draft_config import (
    MAX_DRAFT_DEPTH,
    DraftConfigBase,
    FusionNorms,
    VocabLossChoice,
)

# vLLM reads norm_output only to pick the hidden it hands the next draft step
# (model_executor/models/llama_eagle3.py:286); with parallel_drafting the proposer returns
# after the first forward (v1/spec_decode/llm_base_proposer.py:629), so no next step reads it.
NO_NORM_OUTPUT = (
    "draft.norm_output: P-EAGLE drafts every depth in one forward, so vLLM never feeds the "
    "draft's output back and the switch changes nothing (norm_before_fc and fc_norm apply): "
    "remove the key"
)


class PEagleConfig(DraftConfigBase, FusionNorms, VocabLossChoice):
    algorithm: Literal["peagle"] = "peagle"
    """The draft algorithm: eagle1, eagle3, peagle or dflash (docs/algorithms/); it picks which
    draft.* settings exist."""
    aux_layer_ids: list[int] | None = None
    """Target layers whose hidden states fc fuses, in the "after k layers" convention (vLLM's).
    None: (2, L//2, L-3)."""
    num_layers: int = Field(default=4, ge=1, le=MAX_DRAFT_DEPTH)
    """EAGLE-3's fused first layer plus (num_layers - 1) ordinary decoder layers. EAGLE-3.1's
    norm_before_fc and fc_norm (FusionNorms) apply to the aux features and mask_hidden alike
    (vLLM passes both through combine_hidden_states)."""
    parallel_steps: int = Field(default=4, ge=1, le=MAX_DRAFT_DEPTH)
    """K: depths predicted in one forward (vLLM num_speculative_tokens)."""
    keep_ratio: float = Field(default=0.8, gt=0, le=1)
    """Conditional drop: depth d keeps int((N - d) * max(keep_ratio**d, min_keep_ratio))
    anchors, N the valid anchors of the sequence (a fraction of the WHOLE valid set, not of
    the previous depth), drawn from depth d-1's survivors."""
    min_keep_ratio: float = Field(default=0.2, gt=0, le=1)
    """Conditional drop's floor: every depth keeps at least this fraction of the valid anchors
    (at most keep_ratio)."""
    mask_token_id: int | None = Field(default=None, ge=0)
    """Token fed at depths >= 1; its embedding row is trained and exported. None = the target
    tokenizer's mask token."""
    qk_norm: bool | None = None
    """RMSNorm over each head's q and k before rotary (vLLM serves it as a Qwen3-style layer,
    without as a Llama one); None: as the target's attention does."""
    draft_vocab_size: int | None = Field(default=None, ge=1)
    """The draft's own vocabulary: this many of the most frequent supervised tokens of the
    training data (ties: lower id), built by the trainer from the counts prepare-data wrote.
    None: the target's whole vocabulary."""
    drop_out_of_vocab: bool = False
    """Drop from the loss the positions whose target argmax is outside the draft vocabulary (the
    draft can never propose that token there; SafeAILab's and SpecForge's EAGLE-3 do this).
    Metrics still count them. Default chosen by measurement:
    docs/results/2026-11-30-ab-experiments.md (+0.050 [-0.007, +0.107], 3 seeds: a tie)."""
    num_segments: int = Field(default=1, ge=1)
    """Forward+backward in this many parts per micro-batch, split by anchor position (bounds
    activation memory on long sequences; the summed gradient equals the one-pass one)."""
    attention: Literal["auto", "dense", "flex"] = "auto"
    """Attention over the sampled elements: dense (SDPA with a boolean mask), flex (CUDA:
    compiled flex_attention with a block mask from the elements); auto = flex on CUDA."""

    @model_validator(mode="before")
    @classmethod
    def _refused_keys(cls, data: Any) -> Any:
        return refuse_moved_key(data, "norm_output", NO_NORM_OUTPUT)

    @model_validator(mode="after")
    def _ratios(self) -> PEagleConfig:
        if self.min_keep_ratio > self.keep_ratio:
            raise SettingError(
                ("min_keep_ratio",), f"must not exceed draft.keep_ratio ({self.keep_ratio})"
            )
        return self
