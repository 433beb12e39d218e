"""The run config of ``train-draft``: target + data + draft + optim + train."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from eagle_train.config import Seed, SettingError, StrictModel, refuse_moved_key
from eagle_train.drafts.registry import DRAFTS, DraftConfig
from eagle_train.evaluate.settings import TrainAcceptance
from eagle_train.optim import OptimConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DtypeName = Literal["bfloat16", "float16", "float32"]


class TargetSection(StrictModel):
    path: Path  # anything AutoModelForCausalLM.from_pretrained loads
    dtype: DtypeName = "bfloat16"
    # Under torchrun, shard the frozen target over the ranks with FSDP2 (each decoder layer
    # gathered for its forward, then freed): a target larger than one device trains online.
    shard: bool = False


class DataSource(StrictModel):
    path: Path  # a prepare-data output directory
    weight: float = Field(
        gt=0, allow_inf_nan=False
    )  # its share of each epoch's rows (weights need not sum to 1)
    # The prepare-features directory made for this path: its train/ split is read instead of
    # running the target. Set on every source or on none.
    features: Path | None = None


class DataSection(StrictModel):
    # A prepare-data output directory, or several mixed by weight, [{path, weight}, ...]:
    # each epoch draws every source's share of rows (data/mixture.py).
    train: Path | list[DataSource]
    val: Path | None = None
    # A prepare-features directory: features are read from it (train/, and val/ when val is
    # set) instead of running the target; only the target's head and embeddings are loaded.
    features: Path | None = None
    micro_batch_size: int = Field(default=4, ge=1)
    # crop sequences (None: as prepared); at most 2**20 tokens
    max_length: int | None = Field(default=None, ge=8, le=1 << 20)
    seed: Seed = 0
    # Training micro-batches of whole rows of similar length up to max_tokens_per_batch padded
    # tokens (None: micro_batch_size rows of the mean length), not micro_batch_size rows
    # padded to the longest (data/packing.py). Validation batches stay micro_batch_size rows.
    # Off by default: on the demo e2e tests it lowered vLLM's acceptance (DFlash llama 2.27
    # against 2.78 unpacked, same steps; docs/results/2026-12-01-packing.md), on SmolLM2 a
    # little (docs/results/2026-12-05-packing-smollm2.md).
    packing: bool = False
    max_tokens_per_batch: int | None = Field(default=None, ge=1)
    # Rows rendered with another chat template than the target's (meta.json records its
    # sha256) are refused: the draft would learn text the served target never sees. True
    # says the mismatch is intended (e.g. a template that only adds a system prompt).
    allow_chat_template_mismatch: bool = False

    @model_validator(mode="after")
    def _budget_needs_packing(self) -> DataSection:
        if self.max_tokens_per_batch is not None and not self.packing:
            raise SettingError(
                ("max_tokens_per_batch",),
                "a packing budget, but data.packing is false: set data.packing: true or remove it",
            )
        return self

    @property
    def train_dir(self) -> Path:
        """``train`` as one directory (a feature cache is built for one)."""
        if not isinstance(self.train, Path):
            raise ValueError("data.train: a mixture has no single directory")
        return self.train

    @property
    def from_cache(self) -> bool:
        """Features read from prepare-features caches (data.features, or every source's)."""
        if isinstance(self.train, list):
            return self.train[0].features is not None
        return self.features is not None

    @model_validator(mode="after")
    def _mixture_sources(self) -> DataSection:
        if isinstance(self.train, list):
            problem = mixture_problem(self.train, self.features, self.val)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="before")
    @classmethod
    def _size_moved(cls, data: Any) -> Any:
        return refuse_moved_key(
            data,
            "draft_vocab_size",
            "data.draft_vocab_size moved to draft.draft_vocab_size (the draft vocabulary "
            "size is a property of the draft): set it there",
        )


def mixture_problem(
    sources: list[DataSource], features: Path | None, val: Path | None
) -> str | None:
    """What is wrong with a ``data.train`` mixture (None: nothing). Its sources are read
    online, or every one from its own cache; ``data.features`` then holds data.val's."""
    paths = [s.path for s in sources]
    if not paths:
        return "data.train: expected a directory or at least one {path, weight}"
    seen: dict[Path, Path] = {}
    for path in paths:  # resolved: one dataset named twice through a symlink is one source
        real = Path(path).expanduser().resolve()
        if real in seen:
            same = "" if seen[real] == path else f" (as {seen[real]} and {path})"
            return f"data.train: a source is listed twice{same} (merge its weights)"
        seen[real] = path
    if not math.isfinite(sum(s.weight for s in sources)):
        return "data.train: the weights' sum is not a finite number: weights are shares, use smaller ones"
    online = [str(s.path) for s in sources if s.features is None]
    if online and len(online) < len(sources):
        return (
            f"data.train: features is set on some sources but not on {', '.join(online)}: a "
            "mixture reads every source from its feature cache, or none"
        )
    if online and features is not None:
        return (
            "data.features: a feature cache holds one dataset's rows; a data.train mixture "
            "names each source's cache (data.train[i].features) or trains online"
        )
    if not online and val is not None and features is None:
        return (
            "data.val: a mixture read from feature caches validates from one too: set "
            "data.features to the prepare-features directory holding data.val's (its val/)"
        )
    if not online and val is None and features is not None:
        return (
            "data.features: with a data.train mixture it holds only data.val's cache, and "
            "data.val is unset (each source's cache is data.train[i].features)"
        )
    return None


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
    seed: Seed = 0
    # auto: cuda when available, else cpu (each rank takes its LOCAL_RANK's GPU)
    device: Literal["auto", "cpu", "cuda"] = "auto"
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

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_is_not_a_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # YAML reads yes/no/true/false as booleans
            raise ValueError(
                f"expected auto, a checkpoint path or null (got {str(value).lower()}: "
                "for 'continue where it stopped' write auto)"
            )
        return value

    acceptance: TrainAcceptance = TrainAcceptance()  # vLLM acceptance length while training


class RunConfig(StrictModel):
    target: TargetSection
    data: DataSection
    draft: DraftConfig
    optim: OptimConfig = OptimConfig()
    train: TrainSection

    @field_validator("draft", mode="before")
    @classmethod
    def _draft_vocab_is_used(cls, draft: Any) -> Any:
        if isinstance(draft, dict) and "draft_vocab_size" in draft:
            name = draft.get("algorithm")
            if name in DRAFTS and not DRAFTS[name].uses_draft_vocab:
                raise SettingError(
                    ("draft_vocab_size",),
                    f"the {name} draft has no draft vocabulary (it predicts over the target's "
                    "whole vocabulary): remove the key",
                )
        return draft

    @field_validator("train")
    @classmethod
    def _sampling_is_used(cls, train: TrainSection, info: ValidationInfo) -> TrainSection:
        """train.acceptance.temperature > 0 samples in the probe (train.acceptance.every) and
        in validation's sim_accept_len_sampled (data.val); with neither it changes nothing."""
        acceptance, data = train.acceptance, info.data.get("data")
        if acceptance.temperature > 0 and acceptance.every is None and data and not data.val:
            raise SettingError(
                ("acceptance", "temperature"),
                "nothing in this run samples with it: it applies to the probe (train.acceptance.every) and to "
                "validation's sim_accept_len_sampled (data.val); set one of them or remove it",
            )
        return train


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
