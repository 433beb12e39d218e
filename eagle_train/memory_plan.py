"""What a training run will hold at its peak, from shapes and settings, and what the device has.

The pre-flight of ``train-draft`` (``train_setup.check_memory``) adds up, per rank:

- weights already loaded: the target's (or only its head and embeddings when the features
  come from a cache) and the draft's, in their dtypes;
- the optimizer's state (``MasterWeightAdamW``): fp32 master weights and two fp32 moments per
  trainable parameter (12 bytes), or two moments in the storage dtype without masters;
- the gradients of the trainable parameters, and the chunked loss's fp32 head-gradient
  accumulator where the head trains;
- the activations backward keeps (``unit_bytes``): per *unit*, a position the draft's layers
  run on (a token x training-time-test step, a sampled element, a block slot: each draft's
  spec states its count, ``DraftSpec.activations``), what torch saves: the norms' fp32 inputs and outputs, q/k/v (keys and
  values also repeated to every query head), the attention output and its log-sum-exp, the
  MLP's gate, up and product, the residual, the final norm and the loss's head-input
  gradient; plus what is kept once per token (the target's features the draft reads);
- the target head's rows the loss reads the target's logits from (``target_head_bytes``):
  their copy when the draft scores a subset of the vocabulary, and on CPU the fp32 copy of
  a half-precision head that the matmul uses (``target_model.frozen.matmul_weight``), made
  once per step;
- the loss's transient (``loss_chunk_bytes``): a chunk of [rows, vocabulary] fp32 tensors,
  ``LOSS_CHUNK_TENSORS`` of them alive at once (drafts/vocab_loss.py);
- the target's forward over the micro-batch when it runs online (one layer's working set).

Measured against it (``tests/train/test_memory_plan.py``): one training step at the tiny world's
shape stays below the estimate, and the estimate is within 2x of it. Pure arithmetic on
plain numbers: it imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# fp32 [rows, vocabulary] tensors alive at once inside one chunk of the loss (the draft's
# logits, their fp32 copy, log-softmax, the target's logits and probabilities, their product
# and the logits' gradient): measured 7 on the tiny world's EAGLE-3 step, one kept spare.
LOSS_CHUNK_TENSORS = 8
# What torch keeps per unit beyond the tensors ``unit_bytes`` lists (views made contiguous,
# masks, the loss's per-row buffers, the allocator's rounding): the marginal memory of one
# more unit measured 1.2x the list at SmolLM2's shape in fp32
# (docs/results/2026-12-07-vocab-loss-memory.md: 73.7 KiB) and 2.6x at the tiny world's
# shape (H 64) with a 4,096-token vocabulary; 3 covers both.
ACTIVATION_MARGIN = 3
FP32 = 4
GIB = 1 << 30


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer of the draft."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    qk_norm: bool = False  # Qwen3-style RMSNorms on q and k


@dataclass(frozen=True)
class DraftActivations:
    """What a draft's forward runs on for one micro-batch, as its spec states it: ``units``
    positions through ``num_layers`` layers of ``layer``'s shape; the first layer's q/k/v
    input is ``first_input`` wide behind ``first_norms`` RMSNorms (EAGLE's fused [embedding,
    feature]: 2H behind two norms); ``per_token`` elements are kept once per token of the
    micro-batch (the target features fc reads, the context's keys and values)."""

    units: int
    layer: LayerShape
    num_layers: int
    first_input: int
    first_norms: int
    per_token: int
    what: str  # the setting that sets units per token, for messages: "draft.ttt_steps=7"


def _norm_bytes(width: int, act: int) -> int:
    """An RMSNorm keeps its input in fp32, its rsqrt and its normed output in ``act`` bytes."""
    return width * FP32 + FP32 + width * act


def _layer_bytes(shape: LayerShape, in_width: int, norms: int, act: int) -> int:
    h, d = shape.hidden_size, shape.head_dim
    q, kv = shape.num_heads * d, shape.num_kv_heads * d
    attention = act * (in_width + 2 * q + 2 * q + 2 * kv) + FP32 * shape.num_heads
    if shape.qk_norm:
        attention += _norm_bytes(q, act) + _norm_bytes(kv, act)
    post_norm = _norm_bytes(h, act)
    mlp = act * 4 * shape.intermediate_size
    return norms * _norm_bytes(in_width // norms, act) + attention + post_norm + mlp + act * h


def unit_bytes(acts: DraftActivations, act: int) -> int:
    """Bytes backward keeps per unit, ``act`` bytes per activation element (the draft's
    storage dtype); the loss keeps its head-input gradient and a few fp32 scalars per row."""
    shape = acts.layer
    first = _layer_bytes(shape, acts.first_input, acts.first_norms, act)
    rest = (acts.num_layers - 1) * _layer_bytes(shape, shape.hidden_size, 1, act)
    final = _norm_bytes(shape.hidden_size, act) + act * shape.hidden_size + 8 * FP32
    return first + rest + final


def activation_bytes(acts: DraftActivations, tokens: int, act: int) -> int:
    """Everything backward keeps for a micro-batch of ``tokens`` (padded) tokens, with the
    measured margin over the listed tensors."""
    listed = acts.units * unit_bytes(acts, act) + tokens * acts.per_token * act
    return ACTIVATION_MARGIN * listed


def loss_chunk_bytes(rows: int, vocab: int, chunk_elements: int) -> int:
    """The loss's working set: one chunk of at most ``chunk_elements`` [rows, vocabulary]
    elements, ``LOSS_CHUNK_TENSORS`` fp32 tensors of it at once."""
    return min(rows * vocab, chunk_elements) * FP32 * LOSS_CHUNK_TENSORS


def target_head_bytes(scored: int, hidden: int, act: int, subset: bool, upcast: bool) -> int:
    """The target head's ``scored`` rows as the loss uses them in a step: indexed out of the
    head (a copy in its dtype, ``act`` bytes) when ``subset``, and in fp32 when ``upcast``
    (a half-precision head on CPU). Counted for every draft, though a draft trained on
    ``hard_ce`` alone never reads the target's logits (an over-count of at most one fp32 head)."""
    return scored * hidden * ((act if subset else 0) + (FP32 if upcast else 0))


def optimizer_bytes(trainable: int, storage: int, fp32_masters: bool) -> int:
    """MasterWeightAdamW's state: fp32 masters and moments (none of the masters when the
    draft is fp32 already), or two moments in the storage dtype without masters."""
    if not fp32_masters:
        return 2 * storage * trainable
    return (2 * FP32 + (FP32 if storage < FP32 else 0)) * trainable


def target_forward_bytes(tokens: int, shape: LayerShape, act: int) -> int:
    """One target layer's working set over ``tokens`` (its features are kept by the draft's
    ``per_token``; the layers' outputs are not kept)."""
    h, d = shape.hidden_size, shape.head_dim
    qkv = (shape.num_heads + 2 * shape.num_kv_heads) * d
    return tokens * act * (3 * h + 3 * shape.intermediate_size + qkv + shape.num_heads * d)


@dataclass
class MemoryPlan:
    """The peak of a run in parts (bytes); ``held`` names the parts already allocated when
    the plan is checked, so ``to_come`` is what must still fit in what is available."""

    parts: dict[str, int]
    held: tuple[str, ...] = ()
    settings: list[str] = field(default_factory=list)  # what sizes the activations

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def to_come(self) -> int:
        return sum(v for k, v in self.parts.items() if k not in self.held)

    def describe(self) -> str:
        return ", ".join(f"{k} {gib(v)}" for k, v in self.parts.items() if v)


def gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


def available_bytes(device_type: str, index: int | None = None) -> int:
    """What the device can still allocate: on CUDA the free memory the driver reports, on the
    CPU ``MemAvailable`` of /proc/meminfo (what can be allocated without swapping)."""
    if device_type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(index)[0])
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable line")
