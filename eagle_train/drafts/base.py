"""What every draft algorithm provides to the loop and the exporter (one folder each)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor, nn

from eagle_train.config import StrictModel
from eagle_train.data.loader import Batch
from eagle_train.data.vocab import VocabMapping
from eagle_train.memory_plan import DraftActivations
from eagle_train.target_model import FrozenTarget, TargetDescription, TargetFeatures
from eagle_train.target_model.description import Capability


@dataclass
class StepResult:
    loss: Tensor  # scalar to backpropagate
    metrics: dict[str, float]  # per-batch means, combined across batches by `weight`
    weight: int  # supervised slots behind the metrics


@dataclass
class SpeculatorsFields:
    """How a drafter is written in the vllm-project/speculators format (vLLM reads it with
    ``transformers_utils/configs/speculators``): the algorithm's ``speculators_model_type``
    and class name, its top-level fields, the native config keys they replace (the rest of
    the native config is the ``transformer_layer_config``), and tensors only that format
    carries."""

    speculators_type: str
    architecture: str
    fields: dict[str, Any]
    moved: tuple[str, ...]
    extra_tensors: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class VllmDrafter:
    """An export: vLLM's config.json, the tensors, and how to serve it."""

    config: dict[str, Any]
    tensors: dict[str, Tensor]
    method: str  # vLLM speculative_config.method
    num_speculative_tokens: int
    extra_speculative_config: dict[str, Any] = field(default_factory=dict)
    speculators: SpeculatorsFields | None = None  # None: vLLM reads no speculators format


class DraftSpec(Protocol):
    name: str
    config_cls: type[StrictModel]
    vllm_method: str  # speculative_config.method its exports are served with
    target_needs: Capability  # what vLLM's target must hand this drafter
    # Whether the draft has a vocabulary of its own (d2t/t2d); False: it predicts over the
    # target's whole vocabulary through the target's head.
    uses_draft_vocab: bool
    # None: vLLM's CPU build serves it too; else why only a GPU build does (one line).
    gpu_only: str | None

    def served_tokens(self, config: dict[str, Any]) -> int | None:
        """K that vLLM drafts per step for a drafter of this config.json when nothing else
        states it (None: the config does not say)."""
        ...

    def recognizes(self, config: dict[str, Any]) -> bool:
        """Whether a drafter config.json (from any exporter) is this algorithm's format."""

    def target_layer_ids(self, cfg: Any, target: TargetDescription) -> list[int]:
        """Target layers (after-k-layers convention) whose hidden states the draft reads."""

    def build(self, cfg: Any, target: FrozenTarget, vocab: VocabMapping | None) -> nn.Module:
        """A fresh draft in fp32 (the loop casts it to the storage dtype)."""

    def compute_loss(
        self, draft: nn.Module, features: TargetFeatures, batch: Batch, cfg: Any
    ) -> StepResult:
        """The whole micro-batch in one forward (training and validation).

        A spec MAY also define ``loss_parts(draft, features, batch, cfg) -> list[Callable[[],
        StepResult]]``: the micro-batch split into parts (sampling done once, before), each
        thunk running one part's forward. Each part's ``loss`` is already divided by the
        micro-batch's total supervised count, so the parts' gradients sum to the one-pass
        gradient; its ``weight`` is the part's supervised count. The loop backpropagates each
        part as soon as it returns (under DDP ``no_sync`` for all but the last), and every
        part's backward reaches every trainable parameter."""

    def activations(
        self, cfg: Any, target: TargetDescription, tokens: int, rows: int
    ) -> DraftActivations:
        """What the draft's forward runs on for a micro-batch of ``tokens`` padded tokens in
        at most ``rows`` rows (the memory pre-flight, ``memory_plan``)."""

    def propose(
        self,
        draft: nn.Module,
        features: TargetFeatures,
        input_ids: Tensor,
        cfg: Any,
        num_steps: int,
    ) -> Tensor:
        """(B, T, num_steps) target token ids the draft proposes at each slot: entry [t, k]
        is its guess for x_{t+2+k}, chained on the true tokens."""

    def to_vllm(self, state: dict[str, Tensor], cfg: Any, target: TargetDescription) -> VllmDrafter:
        """vLLM's on-disk drafter from a draft state dict."""

    def expected_tensors(
        self, config: dict[str, Any]
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """(required, optional) tensors vLLM reads for ``config``, with shapes (the contract)."""

    def from_speculators(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """vLLM's native config of a speculators-format ``config`` of this algorithm's type,
        rebuilt as vLLM's speculators loader does; None when it is another type."""

    def import_tensors(
        self, tensors: dict[str, Tensor], config: dict[str, Any]
    ) -> dict[str, Tensor]:
        """A drafter's tensors (vLLM's names, any layout vLLM serves) under the names of this
        draft's state dict: the inverse of ``to_vllm``'s map (warm start)."""


LossPart = Callable[[], StepResult]


def loss_parts(
    spec: DraftSpec, draft: nn.Module, features: TargetFeatures, batch: Batch, cfg: Any
) -> list[LossPart]:
    """The forward passes of one micro-batch, each to be backpropagated as soon as it runs:
    the spec's own ``loss_parts`` when it splits long sequences (the contract is under
    ``DraftSpec.compute_loss``), else the whole micro-batch as one part."""
    split = getattr(spec, "loss_parts", None)
    if split is not None:
        return split(draft, features, batch, cfg)
    return [lambda: spec.compute_loss(draft, features, batch, cfg)]
