"""EAGLE-3 -> vLLM ``method="eagle3"`` (docs/algorithms/eagle3.md): config.json and tensor names."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from transformers import PretrainedConfig

from eagle_train.drafts.base import VllmDrafter
from eagle_train.drafts.common import decoder_fields, layer_tensors, mirror_target
from eagle_train.drafts.eagle3.config import Eagle3Config


def layer_style(cfg: Eagle3Config, target: PretrainedConfig) -> str:
    if cfg.layer_style != "auto":
        return cfg.layer_style
    return "qwen3" if target.model_type.startswith("qwen3") else "llama"


def vllm_config(
    cfg: Eagle3Config,
    target: PretrainedConfig,
    layer_ids: list[int],
    draft_vocab_size: int,
    head_dim: int,
) -> dict[str, Any]:
    style = layer_style(cfg, target)
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM" if style == "qwen3" else "LlamaForCausalLM"],
        "model_type": style,
        **decoder_fields(target, head_dim, 1),
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": target.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
        "num_aux_hidden_states": len(layer_ids),
        "norm_before_residual": False,
        "dtype": "bfloat16",
    }
    return mirror_target(config, target)


def expected_tensors(
    config: dict[str, Any],
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) tensor shapes for ``config``."""
    h, th = config["hidden_size"], config["target_hidden_size"]
    v, vd = config["vocab_size"], config["draft_vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, config["num_aux_hidden_states"] * th),
        "layers.0.hidden_norm.weight": (h,),
        # the fused layer: q/k/v over cat(embedding, hidden), 2H wide
        **layer_tensors(config, 0, in_width=2 * h, qk_norm=config["model_type"] == "qwen3"),
        "norm.weight": (h,),
        "lm_head.weight": (vd, h),
    }
    if vd != v:  # without d2t vLLM maps draft ids 0..Vd-1 and acceptance collapses
        shapes["d2t"] = (vd,)
    # Absent: vLLM shares the target's embedding; present and different: the draft's own.
    return shapes, {"embed_tokens.weight": (v, h)}


def to_vllm(
    state: dict[str, Tensor], cfg: Eagle3Config, target: PretrainedConfig, layer_ids: list[int]
) -> VllmDrafter:
    vd = state["lm_head.weight"].shape[0]
    head_dim = state["layers.0.self_attn.q_proj.weight"].shape[0] // target.num_attention_heads
    config = vllm_config(cfg, target, layer_ids, vd, head_dim)
    names = set(expected_tensors(config)[0])
    if cfg.train_embedding:  # a trained embedding differs from the target's: ship it
        names.add("embed_tokens.weight")
    tensors = {name: state[name] for name in names if name in state}
    return VllmDrafter(
        config=config, tensors=tensors, method="eagle3", num_speculative_tokens=cfg.ttt_steps
    )
