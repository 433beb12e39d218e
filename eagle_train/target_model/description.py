"""What a draft needs to know about its target, read once from the HF config.

``TargetDescription`` is the one typed view of a target every draft and export receives:
sizes, attention geometry, RoPE, norm style, tied head, the text model inside a multimodal
checkpoint, the layers vLLM captures for auxiliary hidden states, and what vLLM can hand a
drafter for that architecture. Family knowledge (which model types use q/k norms, which
architectures vLLM serves drafts for) lives here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from transformers import AutoConfig, PretrainedConfig

from eagle_train.errors import UserError
from eagle_train.target_model.location import from_pretrained

# What vLLM's target model hands a drafter (its speculative-decoding interfaces):
#   last_hidden_state: the final hidden states (vLLM's SupportsEagle interface);
#   aux_hidden_states: hidden states captured after chosen layers (the interface that
#   EAGLE-3-style and DFlash drafters need; vLLM calls it set_aux_hidden_state_layers).
Capability = Literal["last_hidden_state", "aux_hidden_states"]
_BOTH: tuple[Capability, ...] = ("last_hidden_state", "aux_hidden_states")

# vLLM 0.32's target architectures and the interfaces their classes implement (read from
# vllm/model_executor/models/*.py; tests/target_model/test_target_description.py checks this table
# against the installed vLLM). An architecture not listed here is served with neither.
VLLM_CAPABILITIES: MappingProxyType[str, tuple[Capability, ...]] = MappingProxyType(
    {
        "LlamaForCausalLM": _BOTH,
        "MistralForCausalLM": _BOTH,
        "Qwen2ForCausalLM": _BOTH,
        "Qwen3ForCausalLM": _BOTH,
        "Qwen3MoeForCausalLM": _BOTH,
        "GptOssForCausalLM": _BOTH,
        "Phi3ForCausalLM": _BOTH,
        "Qwen2_5_VLForConditionalGeneration": _BOTH,
        "Qwen3VLForConditionalGeneration": _BOTH,
        # Implemented by vLLM without a drafting interface: listed so a refusal is explicit.
        "Qwen2VLForConditionalGeneration": (),
        "MixtralForCausalLM": (),
        "Gemma2ForCausalLM": (),
    }
)

# Text model types whose attention normalises q and k per head (RMSNorm over head_dim).
_QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe", "qwen3_vl_text", "qwen3_vl_moe_text"})


class TargetError(UserError, ValueError):
    """The target cannot be used as asked (unknown layout, or vLLM cannot serve it)."""


@dataclass(frozen=True)
class Rope:
    """The target's rotary embedding: type, base and the full parameter set as HF writes it
    (scaling factors, YaRN/llama3 fields, M-RoPE sections), mirrored verbatim by drafts."""

    type: str
    theta: float
    parameters: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class TargetDescription:
    name_or_path: str
    architecture: str  # the checkpoint's class, as vLLM resolves it
    model_type: str  # of the text model (e.g. qwen2_5_vl_text inside qwen2_5_vl)
    text_config_key: str | None  # "text_config" when the text model is nested (multimodal)
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qk_norm: bool
    rope: Rope
    max_position_embeddings: int
    tied_head: bool
    num_experts: int  # 0 for a dense MLP
    bos_token_id: int | None
    eos_token_id: int | list[int] | None = field(hash=False)
    pad_token_id: int | None
    capabilities: tuple[Capability, ...]  # what vLLM hands a drafter for this architecture

    @property
    def default_aux_layer_ids(self) -> tuple[int, ...]:
        """The layers vLLM captures when a drafter names none: (2, L//2, L-3), in the
        "after k layers" convention (k=0 is the embedding output)."""
        n = self.num_layers
        return (2, n // 2, n - 3)

    def serves(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def mirrored_fields(self) -> dict[str, Any]:
        """The config.json fields a drafter copies so that vLLM builds the same RoPE and
        positions as the target's (max_position_embeddings must cover the serving length:
        vLLM does not raise it for every drafter, and drafting silently stops beyond it)."""
        out: dict[str, Any] = {
            "rope_parameters": dict(self.rope.parameters),
            "max_position_embeddings": self.max_position_embeddings,
        }
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


def architectures_with(capability: Capability) -> list[str]:
    return sorted(a for a, caps in VLLM_CAPABILITIES.items() if capability in caps)


def text_config(config: PretrainedConfig) -> tuple[PretrainedConfig, str | None]:
    """The text model's config and the key it sits under (None when not nested)."""
    nested = getattr(config, "text_config", None)
    if isinstance(nested, PretrainedConfig) and hasattr(nested, "num_hidden_layers"):
        return nested, "text_config"
    return config, None


def describe_target(config: PretrainedConfig, name_or_path: str | None = None) -> TargetDescription:
    """One description of the target from its HF config (nested ``text_config`` handled)."""
    text, key = text_config(config)
    missing = [
        k
        for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")
        if getattr(text, k, None) is None
    ]
    if missing:
        raise TargetError(
            f"target config ({config.model_type}) has no {', '.join(missing)}: expected a "
            "decoder-only causal LM, or a multimodal config with a text_config"
        )
    heads = text.num_attention_heads
    archs = getattr(config, "architectures", None) or []
    architecture = archs[0] if archs else _default_architecture(config)
    return TargetDescription(
        name_or_path=str(name_or_path or getattr(config, "_name_or_path", "") or ""),
        architecture=architecture,
        model_type=text.model_type,
        text_config_key=key,
        num_layers=text.num_hidden_layers,
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        vocab_size=text.vocab_size,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        rms_norm_eps=float(getattr(text, "rms_norm_eps", None) or 1e-6),
        qk_norm=text.model_type in _QK_NORM_MODEL_TYPES,
        rope=_rope(text),
        max_position_embeddings=text.max_position_embeddings,
        tied_head=bool(_first(config, text, "tie_word_embeddings", False)),
        num_experts=int(
            _first(text, text, "num_experts", None) or getattr(text, "num_local_experts", 0) or 0
        ),
        bos_token_id=_first(text, config, "bos_token_id", None),
        eos_token_id=_first(text, config, "eos_token_id", None),
        pad_token_id=_first(text, config, "pad_token_id", None),
        capabilities=VLLM_CAPABILITIES.get(architecture, ()),
    )


def load_target_description(path: str | Path, key: str = "target.path") -> TargetDescription:
    """The description of the target at ``path`` (a local directory or a hub id); a path that
    is no model is one ``ConfigError`` line naming ``key``."""
    return describe_target(from_pretrained(AutoConfig, path, key), str(path))


def _rope(text: PretrainedConfig) -> Rope:
    params = dict(getattr(text, "rope_parameters", None) or {})
    theta = params.get("rope_theta", getattr(text, "rope_theta", None))
    if theta is None:
        raise TargetError(f"target config ({text.model_type}) has no rope_theta")
    params.setdefault("rope_theta", theta)
    params.setdefault("rope_type", "default")
    return Rope(type=params["rope_type"], theta=float(theta), parameters=params)


def _first(a: PretrainedConfig, b: PretrainedConfig, key: str, default: Any) -> Any:
    value = getattr(a, key, None)
    return value if value is not None else getattr(b, key, default)


def _default_architecture(config: PretrainedConfig) -> str:
    """A config built in memory has no ``architectures``: the class transformers maps its
    model type to (what save_pretrained would record)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        model_cls: Any = auto._model_mapping.get(type(config), None)
        if model_cls is not None:
            return str(model_cls.__name__)
    return type(config).__name__.removesuffix("Config")
