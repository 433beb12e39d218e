"""DSpark -> vLLM ``method="dspark"`` (docs/algorithms/dspark.md): config.json and tensor
names as ``vllm/model_executor/models/qwen3_dspark.py`` and the speculators loader read them."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from eagle_train.drafts.base import SpeculatorsFields, VllmDrafter
from eagle_train.drafts.common import decoder_fields, layer_tensors, mirror_target
from eagle_train.drafts.dflash.export import resolve_mask_token_id
from eagle_train.drafts.dspark.config import DSparkConfig
from eagle_train.target_model import TargetDescription

ARCHITECTURE = "Qwen3DSparkModel"
# The keys of the native config that the speculators format moves to its top level.
_SPECULATORS_KEYS = (
    "target_hidden_size",
    "target_layer_ids",
    "mask_token_id",
    "markov_rank",
    "markov_head_type",
    "block_size",
    "enable_confidence_head",
    "confidence_head_with_markov",
    "use_aux_hidden_state",
    "sample_from_anchor",
    "dspark_bonus_anchor",
)


def vllm_config(
    cfg: DSparkConfig,
    target: TargetDescription,
    layer_ids: list[int],
    mask_token_id: int,
    head_dim: int,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        **decoder_fields(target, head_dim, cfg.num_layers),
        "target_hidden_size": target.hidden_size,
        "num_target_layers": target.num_layers,
        # vLLM drafts num_speculative_tokens = block_size when the speculative config omits it
        "block_size": cfg.block_size,
        # 0-based layer outputs; vLLM reads the hidden after id+1 layers (as DFlash's).
        "target_layer_ids": list(layer_ids),
        "use_aux_hidden_state": True,
        # the noise token of the block's slots 1..B-1 (vLLM reads mask_token_id first)
        "mask_token_id": mask_token_id,
        # anchor-as-first-prediction: B query slots, each predicting the next token
        "sample_from_anchor": True,
        "dspark_bonus_anchor": False,
        "markov_rank": cfg.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": cfg.confidence_head,
        "confidence_head_with_markov": cfg.confidence_with_markov,
        "dtype": "bfloat16",
    }
    return mirror_target(config, target)


def expected_tensors(
    config: dict[str, Any],
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) tensor shapes for ``config``. The embedding and lm_head are the
    target's (vLLM shares them when the checkpoint omits them); the confidence head is
    required when the config enables it (vLLM silently drops the head when it is missing)."""
    h, th = config["hidden_size"], config["target_hidden_size"]
    v, r = config["vocab_size"], config["markov_rank"]
    if config.get("draft_vocab_size") not in (None, v):
        raise KeyError("draft_vocab_size (this version exports full-vocabulary DSpark only)")
    n = len(config["target_layer_ids"])
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, n * th),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
        "markov_head.markov_w1.weight": (v, r),
        "markov_head.markov_w2.weight": (v, r),
    }
    if config.get("enable_confidence_head", False):
        width = h + (r if config.get("confidence_head_with_markov", False) else 0)
        shapes["confidence_head.proj.weight"] = (1, width)
        shapes["confidence_head.proj.bias"] = (1,)
    for i in range(config["num_hidden_layers"]):
        shapes.update(layer_tensors(config, i, qk_norm=True))
    return shapes, {}


def to_vllm(
    state: dict[str, Tensor], cfg: DSparkConfig, target: TargetDescription, layer_ids: list[int]
) -> VllmDrafter:
    head_dim = state["layers.0.self_attn.q_proj.weight"].shape[0] // target.num_heads
    config = vllm_config(cfg, target, layer_ids, resolve_mask_token_id(cfg, target), head_dim)
    names = set(expected_tensors(config)[0])
    tensors = {name: state[name] for name in names if name in state}
    # Speculators format (vLLM's update_dspark): the captured layers in the "after k layers"
    # convention, the DSpark fields at the top level.
    fields = {k: config[k] for k in _SPECULATORS_KEYS if k != "target_layer_ids"}
    fields["aux_hidden_state_layer_ids"] = [i + 1 for i in layer_ids]
    speculators = SpeculatorsFields(
        speculators_type="dspark",
        architecture="DSparkSpeculator",
        fields=fields,
        moved=_SPECULATORS_KEYS,
    )
    return VllmDrafter(
        config=config,
        tensors=tensors,
        method="dspark",
        num_speculative_tokens=cfg.block_size,
        speculators=speculators,
    )


def from_speculators(config: dict[str, Any]) -> dict[str, Any] | None:
    """The native config of a speculators-format DSpark drafter, as vLLM's speculators loader
    (``update_dspark``) rebuilds it; None for another type."""
    if config.get("speculators_model_type") != "dspark":
        return None
    native = dict(config.get("transformer_layer_config") or {})
    sample_from_anchor = bool(config.get("sample_from_anchor", False))
    native.update(
        architectures=[ARCHITECTURE],
        target_layer_ids=[i - 1 for i in config.get("aux_hidden_state_layer_ids") or []],
        sample_from_anchor=sample_from_anchor,
        dspark_bonus_anchor=not sample_from_anchor,
    )
    for key in _SPECULATORS_KEYS[:-2] + ("draft_vocab_size",):
        if key != "target_layer_ids" and config.get(key) is not None:
            native[key] = config[key]
    return native
