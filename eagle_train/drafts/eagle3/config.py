"""EAGLE-3 draft config (every default lives here)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eagle_train.drafts.draft_config import (
    MAX_DRAFT_DEPTH,
    DraftConfigBase,
    FusionNorms,
    VocabLossChoice,
)


class Eagle3Config(DraftConfigBase, FusionNorms, VocabLossChoice):
    algorithm: Literal["eagle3"] = "eagle3"
    """The draft algorithm: eagle1, eagle3, peagle or dflash (docs/algorithms/); it picks which
    draft.* settings exist."""
    aux_layer_ids: list[int] | None = None
    """Target layers whose hidden states are fused, in the "after k layers" convention (vLLM's).
    None -> (2, L//2, L-3), which collides on targets with fewer than 7 layers."""
    ttt_steps: int = Field(default=7, ge=1, le=MAX_DRAFT_DEPTH)
    """Training-time test: K draft steps per position, each fed the previous step's own output,
    step k weighted step_decay^k (normalised). Served K is recorded in the export."""
    step_decay: float = Field(default=0.8, gt=0, le=1)
    """The weight of TTT step k in the loss is step_decay^k (normalised over the steps)."""
    num_layers: int = Field(default=1, ge=1, le=MAX_DRAFT_DEPTH)
    """Decoder layers: the first reads cat(embedding, hidden) (2H wide), the others are ordinary
    pre-norm decoder layers over H (vLLM's llama_eagle3.py); every TTT step runs all of them.
    Exported as num_hidden_layers."""
    num_kv_heads: int | None = Field(default=None, ge=1)
    """Key/value heads of the draft's attention (a divisor of the target's query heads; each
    group of query heads shares one value of head_dim). None: the target's. More of them
    widen what attention can carry from an earlier position, a copied token's identity
    included; vLLM serves any count (it sizes the draft layer's KV cache pages on its own)."""
    norm_output: bool = False
    """EAGLE-3.1's vLLM switch (with norm_before_fc and fc_norm): the next TTT step's hidden is
    the final-normed output instead of the pre-norm one."""
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
    copy_supervision: float = Field(default=0.0, ge=0)
    """Copy supervision (drafts/eagle3/copy_loss.py): this weight times the cross-entropy of
    the first layer's copy heads' attention toward the earlier keys where the text went on as
    it is about to go on now (an induction head, what n-gram proposers do), averaged over the
    first copy_steps TTT steps and the copy heads. 0 turns it off; the served weights and their
    layout do not change. Measured: docs/results/2026-12-03-copy-supervision.md,
    docs/results/2026-12-04-copy-weight.md."""
    copy_steps: int = Field(default=1, ge=1)
    """The first this many TTT steps carry copy supervision (at most ttt_steps); measured:
    docs/results/2026-12-04-copy-steps.md."""
    copy_heads: int = Field(default=1, ge=1, le=MAX_DRAFT_DEPTH)
    """Copy heads: the last query head of each of the last copy_heads key/value groups (at most
    the draft's key/value heads); measured: docs/results/2026-12-04-copy-heads.md."""
    train_embedding: bool = False
    """Train the draft's copy of the target embedding (frozen by default; exported only when
    trained)."""
    attention: Literal["auto", "chunked", "fused", "flex"] = "auto"
    """Training-time-test attention kernel: chunked (exact fp32 reference), fused (CPU: torch's
    flash kernel + the chain keys merged by log-sum-exp), flex (CUDA: compiled flex_attention
    with a block mask); auto = flex on CUDA, fused on CPU."""

    @model_validator(mode="after")
    def _copy_steps_within_ttt(self) -> Eagle3Config:
        if self.copy_steps > self.ttt_steps:
            raise ValueError(
                f"copy_steps ({self.copy_steps}) exceeds ttt_steps ({self.ttt_steps}): "
                "copy supervision reads the first copy_steps TTT steps"
            )
        return self
