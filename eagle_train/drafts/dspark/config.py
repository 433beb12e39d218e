"""DSpark draft config (every default lives here): DFlash's settings plus the Markov head,
the confidence head and the weights of DSpark's objective."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eagle_train.drafts.dflash.config import DFlashConfig


class DSparkConfig(DFlashConfig):
    algorithm: Literal["dspark"] = "dspark"  # type: ignore[assignment]
    # Block = [anchor, NOISE x (B-1)]; EVERY slot predicts (slot k: x_{a+k+1}), so vLLM
    # serves it with num_speculative_tokens = B (DeepSpec's published drafters: B = 7).
    block_size: int = Field(default=7, ge=2)
    # Rank r of the Markov head: logits_k += W2 @ W1[previous token] (W1: V x r, W2: V x r).
    # At most the draft's hidden size (checked where the target is known).
    markov_rank: int = Field(default=256, ge=1)
    # Confidence head: sigmoid(w . [h_k, W1[prev]] + b), an estimate of slot k's acceptance
    # given the slots before it were accepted (vLLM's adaptive verification reads it).
    confidence_head: bool = True
    # Whether the confidence head also reads the Markov embedding W1[prev] (vLLM's
    # confidence_head_with_markov; DeepSpec's published drafters: true).
    confidence_with_markov: bool = True
    # DSpark's objective per slot: ce_weight * CE + tv_weight * TV(p_target, q_draft) +
    # confidence_weight * BCE(confidence, its target). Defaults: DeepSpec's (0.1 / 0.9 / 1.0).
    # CE follows draft.loss_target (hard: the data token; distill: the target's distribution).
    ce_weight: float = Field(default=0.1, ge=0)
    tv_weight: float = Field(default=0.9, ge=0)
    confidence_weight: float = Field(default=1.0, ge=0)
    # What the confidence head learns: "tv" = 1 - TV(p, q), the probability that sampling
    # verification accepts the slot's draft (DeepSpec's); "greedy" = 1 when the draft's argmax
    # is the target's (what greedy verification accepts).
    confidence_target: Literal["tv", "greedy"] = "tv"
    # Slot k (0..B-1) weighs exp(-k/gamma); DeepSpec's published value 4 (DFlash's table is
    # for its B-1 masked slots). Set here so DFlash's default does not apply.
    loss_gamma: float | None = Field(default=4.0, gt=0)

    @model_validator(mode="after")
    def _some_loss(self) -> DSparkConfig:
        if self.ce_weight == 0 and self.tv_weight == 0:
            raise ValueError(
                "draft.ce_weight and draft.tv_weight are both 0: the draft's distribution "
                "would not be trained; set one of them above 0"
            )
        if self.confidence_weight > 0 and not self.confidence_head:
            raise ValueError(
                "draft.confidence_weight > 0 with draft.confidence_head false: set "
                "draft.confidence_weight: 0 or draft.confidence_head: true"
            )
        return self
