"""The ``optim`` config section: optimizer, precision contract, kernel and LR schedule.

Every default of the optimizer package lives here (and only here).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eagle_train.config import StrictModel

StorageDtype = Literal["auto", "bfloat16", "float16", "float32"]
Implementation = Literal["auto", "fused", "foreach", "compiled"]
ScheduleName = Literal["constant", "cosine"]


class OptimConfig(StrictModel):
    """Optimizer settings of a training run.

    ``fp32_master_weights`` (on by default) makes ``create_optimizer`` build a
    ``MasterWeightAdamW``: the draft stays in its storage dtype (bf16 next to a bf16 target)
    while the optimizer keeps an fp32 master copy and fp32 moments. Turning it off trains
    the draft purely in its storage dtype: 8 instead of 16 bytes per trainable parameter,
    at the cost of Adam's second moment only ever growing and small updates (RMSNorm gains
    near 1.0) rounding away. It is the low-memory, lower-quality opt-out.
    """

    lr: float = Field(default=1e-4, ge=0.0)
    """Peak learning rate (after warm-up; the schedule decays from it). The SmolLM2 recipe's
    3e-3 was measured against 6e-3 (worse, docs/results/2026-12-05-learning-rate.md)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's (beta1, beta2): the decay rates of the first and second moment (why the moments
    stay fp32: docs/precision.md)."""
    eps: float = Field(default=1e-8, ge=0.0)
    """AdamW's epsilon, added to the square root of the second moment."""
    weight_decay: float = Field(default=0.01, ge=0.0)
    """AdamW's decoupled weight decay, on weight matrices only (not norms, biases, embeddings).
    0.1 against 0 on the SmolLM2 recipe moved nothing on MT-Bench
    (docs/results/2026-12-06-loss-variants.md)."""
    fp32_master_weights: bool = True
    """Keep fp32 master weights and moments in the optimizer (MasterWeightAdamW) while the
    draft lives in its storage dtype; false trains purely in that dtype: 8 instead of 16 bytes
    per parameter, lower quality (docs/precision.md)."""
    dtype: StorageDtype = "auto"
    """The draft's resident (storage) dtype; 'auto': the target's dtype."""
    implementation: Implementation = "auto"
    """The update kernel: 'fused' (torch's fused AdamW on the fp32 masters, bit-exact against
    torch.optim.AdamW(fused=True)), 'foreach' (bit-exact against foreach=True), 'compiled' (one
    torch.compile'd multi-tensor pass per parameter group that also reads the bf16 grad and
    writes the bf16 param; fastest, compiles once per run, falls back to 'fused' if it cannot
    compile), 'auto' (compiled with fp32 master weights, else fused)."""

    def kernel(self) -> Literal["fused", "foreach", "compiled"]:
        """The implementation 'auto' stands for: the fastest one this optimizer has."""
        if self.implementation != "auto":
            return self.implementation
        return "compiled" if self.fp32_master_weights else "fused"

    schedule: ScheduleName = "cosine"
    """The LR schedule after warm-up: 'cosine' decays to min_lr_ratio x lr at train.max_steps;
    'constant' keeps lr."""
    warmup_steps: int = Field(default=0, ge=0)
    """Steps of linear warm-up from 0 to lr (optimizer steps)."""
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    """The cosine schedule's floor, as a fraction of lr."""

    @model_validator(mode="after")
    def _check_betas(self) -> OptimConfig:
        for i, beta in enumerate(self.betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"betas[{i}] must be in [0, 1), got {beta}")
        return self
