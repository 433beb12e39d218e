"""DFlash -> vLLM ``method="dflash"`` (docs/algorithms/dflash.md): config.json and tensor names."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from transformers import AutoTokenizer

from eagle_train.drafts.base import SpeculatorsFields, VllmDrafter
from eagle_train.drafts.common import decoder_fields, layer_tensors, mirror_target
from eagle_train.drafts.dflash.config import DFlashConfig
from eagle_train.target_model import TargetDescription


def resolve_mask_token_id(cfg: DFlashConfig, target: TargetDescription) -> int:
    """The configured mask id, or the target tokenizer's mask token; must be a target id."""
    vocab = target.vocab_size
    token_id = cfg.mask_token_id
    if token_id is None:
        path = target.name_or_path
        token_id = _tokenizer_mask_id(path)
        if token_id is None:
            raise ValueError(
                f"draft.mask_token_id is not set and the target tokenizer ({path or 'no path'}) "
                f"has no mask token: set draft.mask_token_id to the id of a token of the target "
                f"vocabulary (0..{vocab - 1}) that it never generates, e.g. a reserved special "
                "token"
            )
    if not 0 <= token_id < vocab:
        raise ValueError(
            f"draft.mask_token_id {token_id} is not in the target vocabulary (vocab_size "
            f"{vocab}): expected the id of a target token in 0..{vocab - 1}"
        )
    return token_id


def _tokenizer_mask_id(path: str) -> int | None:
    if not path:
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return None
    return tokenizer.mask_token_id


def vllm_config(
    cfg: DFlashConfig,
    target: TargetDescription,
    layer_ids: list[int],
    mask_token_id: int,
    head_dim: int,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        **decoder_fields(target, head_dim, cfg.num_layers),
        "target_hidden_size": target.hidden_size,
        "num_target_layers": target.num_layers,
        # For people and tools only: vLLM drafts num_speculative_tokens = block_size - 1.
        "block_size": cfg.block_size,
        # 0-based layer outputs; vLLM reads the hidden after id+1 layers.
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids)},
        "dtype": "bfloat16",
    }
    return mirror_target(config, target)


def expected_tensors(
    config: dict[str, Any],
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) tensor shapes for ``config``, as vLLM's DFlash ``load_weights``
    (``qwen3_dflash.py``) takes them. This project's exports ship the required ones only:
    embed_tokens and lm_head are the target's. A drafter with a draft vocabulary of its own
    (``draft_vocab_size`` below the target's, as speculators writes one) needs its lm_head
    and ``d2t``; an embedding or a full-vocabulary head shipped anyway is the drafter's own
    (vLLM keeps it). ``mask_hidden`` makes vLLM's DFlash loader assert: never accepted."""
    h, th = config["hidden_size"], config["target_hidden_size"]
    v = config["vocab_size"]
    vd = config.get("draft_vocab_size") or v
    n = len(config["dflash_config"]["target_layer_ids"])
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, n * th),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(config["num_hidden_layers"]):
        shapes.update(layer_tensors(config, i, qk_norm=True))
    optional: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (v, h)}
    if vd != v:
        shapes.update({"lm_head.weight": (vd, h), "d2t": (vd,)})
    else:
        optional["lm_head.weight"] = (v, h)
    return shapes, optional


def to_vllm(
    state: dict[str, Tensor], cfg: DFlashConfig, target: TargetDescription, layer_ids: list[int]
) -> VllmDrafter:
    head_dim = state["layers.0.self_attn.q_proj.weight"].shape[0] // target.num_heads
    config = vllm_config(cfg, target, layer_ids, resolve_mask_token_id(cfg, target), head_dim)
    names = set(expected_tensors(config)[0])
    tensors = {name: state[name] for name in names if name in state}
    # Speculators format: the captured layers in the "after k layers" convention (vLLM
    # subtracts one for dflash_config); non-causal draft attention, as the native config.
    speculators = SpeculatorsFields(
        speculators_type="dflash",
        architecture="DFlashSpeculator",
        fields={
            "target_hidden_size": config["target_hidden_size"],
            "aux_hidden_state_layer_ids": [i + 1 for i in layer_ids],
            "mask_token_id": config["dflash_config"]["mask_token_id"],
            "block_size": cfg.block_size,
            "sliding_window_non_causal": True,
        },
        moved=("target_hidden_size", "dflash_config", "block_size"),
    )
    return VllmDrafter(
        config=config,
        tensors=tensors,
        method="dflash",
        num_speculative_tokens=cfg.block_size - 1,
        speculators=speculators,
    )


def from_speculators(config: dict[str, Any]) -> dict[str, Any] | None:
    """The native config of a speculators-format DFlash drafter, as vLLM's speculators
    loader rebuilds it (``update_dflash`` in ``transformers_utils/configs/speculators``):
    ``aux_hidden_state_layer_ids`` ("after k layers") become ``dflash_config.target_layer_ids``
    (0-based outputs) and stay as ``eagle_aux_hidden_state_layer_ids``; the draft attends
    causally unless ``sliding_window_non_causal`` (absent: non-causal); None for another
    type."""
    if config.get("speculators_model_type") != "dflash":
        return None
    native = dict(config.get("transformer_layer_config") or {})
    aux = list(config.get("aux_hidden_state_layer_ids") or [])
    native.update(
        architectures=["DFlashDraftModel"],
        eagle_aux_hidden_state_layer_ids=aux,
        dflash_config={
            "mask_token_id": config.get("mask_token_id"),
            "target_layer_ids": [i - 1 for i in aux],
            "sample_from_anchor": config.get("sample_from_anchor", False),
            "causal": not config.get("sliding_window_non_causal", True),
        },
    )
    if config.get("target_hidden_size") is not None:
        native["target_hidden_size"] = config["target_hidden_size"]
    if config.get("draft_vocab_size") not in (None, native.get("vocab_size")):
        native["draft_vocab_size"] = config["draft_vocab_size"]  # its own head and d2t
    return native


def import_tensors(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """A drafter's tensors under this draft's names: the export map is a filter (the
    embedding and head stay the target's), so the inverse is the identity."""
    return dict(tensors)
