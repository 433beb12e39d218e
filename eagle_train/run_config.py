"""The run config of ``train-draft``: target + data + draft + optim + train."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator

from eagle_train.config import StrictModel
from eagle_train.drafts.registry import DraftConfig, get_draft
from eagle_train.evaluate.settings import TrainAcceptance
from eagle_train.optim import OptimConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DtypeName = Literal["bfloat16", "float16", "float32"]


class TargetSection(StrictModel):
    path: Path  # anything AutoModelForCausalLM.from_pretrained loads
    dtype: DtypeName = "bfloat16"


class DataSection(StrictModel):
    train: Path  # a prepare-data output directory
    val: Path | None = None
    micro_batch_size: int = Field(default=4, ge=1)
    max_length: int | None = Field(default=None, ge=8)  # crop sequences (None: as prepared)
    seed: int = 0
    # Build the draft vocabulary in the trainer: each rank counts its shard, counts are
    # summed over ranks. None: use the mapping prepare-data wrote (if any).
    draft_vocab_size: int | None = Field(default=None, ge=1)


class TrainSection(StrictModel):
    output_dir: Path
    max_steps: int = Field(default=1000, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    grad_clip: float | None = Field(default=1.0, gt=0)
    log_every: int = Field(default=10, ge=1)
    val_every: int = Field(default=200, ge=1)
    val_batches: int | None = Field(default=20, ge=1)  # None: the whole validation set
    save_every: int = Field(default=500, ge=1)
    keep_last: int = Field(default=3, ge=1)
    seed: int = 0
    device: str = "auto"  # auto: cuda when available, else cpu
    # Several ranks (torchrun): ddp replicates the draft; fsdp (FSDP2) shards it and its
    # fp32 optimizer state, for large drafts.
    parallel: Literal["ddp", "fsdp"] = "ddp"
    # "auto": continue from the newest intact checkpoint under output_dir (fresh start if
    # there is none); a path: that checkpoint; None: fresh, refusing a dir with checkpoints.
    resume: str | None = None
    nonfinite: Literal["stop", "skip"] = "stop"  # on a non-finite loss or gradient norm
    max_skipped_steps: int = Field(default=50, ge=0)  # "skip": stop after this many skips
    dist_timeout_s: float = Field(default=600.0, gt=0)  # collectives, when no agent stops us
    tensorboard: bool = True
    progress: bool = True
    acceptance: TrainAcceptance = TrainAcceptance()  # vLLM acceptance length while training


class RunConfig(StrictModel):
    target: TargetSection
    data: DataSection
    draft: DraftConfig
    optim: OptimConfig = OptimConfig()
    train: TrainSection

    @model_validator(mode="after")
    def _draft_vocab_is_used(self) -> RunConfig:
        name = self.draft.algorithm
        if self.data.draft_vocab_size is not None and not get_draft(name).uses_draft_vocab:
            raise ValueError(
                f"data.draft_vocab_size is set, but the {name} draft has no draft vocabulary "
                "(it predicts over the target's whole vocabulary): remove the key"
            )
        return self


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
