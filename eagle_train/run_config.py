"""The run config of ``train-draft``: target + data + draft + optim + train."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from eagle_train.config import Seed, SettingError, StrictModel
from eagle_train.drafts.registry import DRAFTS, DraftConfig
from eagle_train.evaluate.settings import TrainAcceptance
from eagle_train.optim import OptimConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DtypeName = Literal["bfloat16", "float16", "float32"]


class TargetSection(StrictModel):
    path: Path
    """The frozen target: a local directory or hub id that transformers'
    AutoModelForCausalLM.from_pretrained loads."""
    dtype: DtypeName = "bfloat16"
    """The dtype the target runs in while training (and the draft's storage dtype under
    optim.dtype: auto); bf16 is what vLLM serves."""
    shard: bool = False
    """Under torchrun, shard the frozen target over the ranks with FSDP2 (each decoder layer
    gathered for its forward, then freed): a target larger than one device trains online."""


class DataSource(StrictModel):
    path: Path
    """A prepare-data output directory."""
    weight: float = Field(gt=0, allow_inf_nan=False)
    """Its share of each epoch's rows (weights need not sum to 1)."""
    features: Path | None = None
    """The prepare-features directory made for this path: its train/ split is read instead of
    running the target. Set on every source or on none."""


class DataSection(StrictModel):
    train: Path | list[DataSource]
    """The training rows: a prepare-data output directory, or several mixed by weight, [{path,
    weight}, ...]: each epoch draws every source's share of rows (data/mixture.py)."""
    val: Path | None = None
    """A prepare-data output directory for validation (loss, accuracy and simulated acceptance
    every train.val_every steps); None: no validation."""
    features: Path | None = None
    """A prepare-features directory: features are read from it (train/, and val/ when val is
    set) instead of running the target; only the target's head and embeddings are loaded."""
    micro_batch_size: int = Field(default=4, ge=1)
    """Rows per micro-batch on each rank (one optimizer step takes micro_batch_size x
    train.grad_accum x ranks rows)."""
    max_length: int | None = Field(default=None, ge=8, le=1 << 20)
    """Crop rows to this many tokens (None: as prepared)."""
    seed: Seed = 0
    """Seed of the row order (each epoch a new permutation drawn from it; exact on resume)."""
    packing: bool = False
    """Training micro-batches of whole rows of similar length up to max_tokens_per_batch padded
    tokens (None: micro_batch_size rows of the mean length), not micro_batch_size rows padded
    to the longest (data/packing.py). Validation batches stay micro_batch_size rows. Off by
    default: on the demo e2e tests it lowered vLLM's acceptance (the Llama block draft's 2.27
    against 2.78 unpacked, same steps; docs/results/2026-12-01-packing.md), on SmolLM2 a little
    (docs/results/2026-12-05-packing-smollm2.md)."""
    max_tokens_per_batch: int | None = Field(default=None, ge=1)
    """With packing: padded tokens per training micro-batch (None: micro_batch_size rows of the
    data's mean length)."""
    allow_chat_template_mismatch: bool = False
    """Train on rows rendered with another chat template than the target's (meta.json records
    its sha256). False: refused, since the draft would learn text the served target never
    sees; true says the mismatch is intended (e.g. a template that only adds a system
    prompt)."""

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
    """The run directory: config.yaml, metrics.jsonl, checkpoints/, best/
    (docs/training.md#what-a-run-writes). New, empty or an earlier train-draft run's."""
    max_steps: int = Field(default=1000, ge=1)
    """Optimizer steps to train (the LR schedule ends here)."""
    grad_accum: int = Field(default=1, ge=1)
    """Micro-batches whose gradients are summed per optimizer step."""
    grad_clip: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this value (None: no clipping; the norm is still
    logged)."""
    log_every: int = Field(default=10, ge=1)
    """Write metrics.jsonl (and TensorBoard) every this many steps."""
    val_every: int = Field(default=200, ge=1)
    """Validate on data.val every this many steps."""
    val_batches: int | None = Field(default=20, ge=1)
    """Validation micro-batches per validation (None: the whole validation set)."""
    save_every: int = Field(default=500, ge=1)
    """Write a checkpoint every this many steps (and at the end)."""
    keep_last: int = Field(default=3, ge=1)
    """Checkpoints kept under checkpoints/; older ones are deleted after each save."""
    seed: Seed = 0
    """Seed of the draft's initialisation and of every random draw in training (noise, sampled
    anchors)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """'auto': cuda when available, else cpu; 'cpu'; or 'cuda' (each rank takes its
    LOCAL_RANK's GPU; refused where torch sees none)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Several ranks (torchrun): ddp replicates the draft; fsdp (FSDP2) shards it and its fp32
    optimizer state, for large drafts."""
    resume: str | None = None
    """'auto': continue from the newest intact checkpoint under output_dir (fresh start if
    there is none); a path: that checkpoint; None: fresh, refusing a directory with
    checkpoints."""
    nonfinite: Literal["stop", "skip"] = "stop"
    """On a non-finite loss or gradient norm: 'stop' the run with an error, or 'skip' the step
    (no update)."""
    max_skipped_steps: int = Field(default=50, ge=0)
    """With nonfinite: skip, stop after this many skipped steps."""
    dist_timeout_s: float = Field(default=600.0, gt=0)
    """Timeout of collectives (seconds), so a rank that died does not hang the others when no
    agent stops them."""
    tensorboard: bool = True
    """Also write the metrics as TensorBoard events under output_dir/tensorboard."""
    progress: bool = True
    """Show a progress bar with the latest metrics (rank 0)."""
    memory_check: bool = True
    """Before the first step, estimate the run's peak memory per rank from its shapes and
    settings (weights, optimizer state, gradients, the activations draft.ttt_steps /
    parallel_steps / block_size x data.max_length x data.micro_batch_size keep, the loss's
    chunk) and refuse, in one line, a run whose estimate does not fit what the device has
    free (docs/training.md#memory). False: log the estimate and train anyway."""
    memory_limit_gib: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Compare the memory estimate with this many GiB per rank instead of what the device
    reports free at the start (None): to leave room for other processes on a shared device."""

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_is_not_a_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # YAML reads yes/no/true/false as booleans
            raise ValueError(
                f"expected auto, a checkpoint path or null (got {str(value).lower()}: "
                "for 'continue where it stopped' write auto)"
            )
        return value

    acceptance: TrainAcceptance = TrainAcceptance()
    """vLLM acceptance length while training: every train.acceptance.every steps the draft is
    exported and served next to the target; the best is kept under best/."""


class RunConfig(StrictModel):
    target: TargetSection
    """The frozen target the draft is trained for."""
    data: DataSection
    """The prepared training (and validation) rows, or feature caches made from them."""
    draft: DraftConfig
    """The draft: draft.algorithm picks eagle1, eagle3, peagle or dflash (docs/algorithms/),
    and with it the other draft.* settings."""
    optim: OptimConfig = OptimConfig()
    """The optimizer (AdamW with fp32 master weights by default) and its LR schedule."""
    train: TrainSection
    """The loop: steps, logging, validation, checkpoints, devices, resume."""

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
