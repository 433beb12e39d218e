"""EAGLE-1 -> vLLM ``method="eagle"`` (docs/algorithms/eagle1.md): a plain Llama config.

vLLM has only a Llama-style EAGLE-1 drafter (it renames LlamaForCausalLM to
EagleLlamaForCausalLM), so the draft uses Llama layers whatever the target's family; only
the sizes and RoPE are mirrored from the target. vLLM always uses the target's lm_head, and
layer 0 has no input_layernorm (shipping one, a final norm or an lm_head raises in vLLM).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from eagle_train.drafts.base import VllmDrafter
from eagle_train.drafts.common import decoder_fields, layer_tensors, mirror_target
from eagle_train.drafts.eagle1.config import Eagle1Config
from eagle_train.target_model import TargetDescription


def vllm_config(cfg: Eagle1Config, target: TargetDescription, head_dim: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **decoder_fields(target, head_dim, cfg.num_layers),
        "mlp_bias": False,
        "dtype": "bfloat16",
    }
    return mirror_target(config, target)


def expected_tensors(
    config: dict[str, Any],
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) tensor shapes for ``config``."""
    h = config["hidden_size"]
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, 2 * h)}
    for i in range(config["num_hidden_layers"]):
        # vLLM replaces layer 0's input_layernorm by identity
        shapes.update(layer_tensors(config, i, input_norm=i > 0))
    return shapes, {"embed_tokens.weight": (config["vocab_size"], h)}


def to_vllm(state: dict[str, Tensor], cfg: Eagle1Config, target: TargetDescription) -> VllmDrafter:
    head_dim = state["layers.0.self_attn.q_proj.weight"].shape[0] // target.num_heads
    config = vllm_config(cfg, target, head_dim)
    names = set(expected_tensors(config)[0])  # the frozen embedding/head copies stay behind
    tensors = {name: state[name] for name in names if name in state}
    return VllmDrafter(
        config=config,
        tensors=tensors,
        method="eagle",
        num_speculative_tokens=cfg.num_speculative_tokens,
    )


def import_tensors(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """A drafter's tensors under this draft's names: the export map is a filter, so the
    inverse is the identity (a shipped ``embed_tokens`` replaces the frozen copy)."""
    return dict(tensors)
