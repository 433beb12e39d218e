"""Which target architectures vLLM can serve a draft next to (one place, one table).

Drafts that read several target layers (``DraftSpec.reads_aux_hidden_states``) need a target
class implementing vLLM's auxiliary-hidden-state interface; any other target fails when the
engine starts ("Model does not support ... interface"), i.e. after a whole training run. The
table is vLLM 0.32's list of causal-LM architectures whose class implements it (read from
``vllm.model_executor.models`` with its interface check). Drafts reading only the last layer
are not restricted.
"""

from __future__ import annotations

from collections.abc import Iterable

VLLM_VERSION = "0.32"
AUX_HIDDEN_STATE_TARGETS = frozenset(
    {
        "AfmoeForCausalLM",
        "ApertusForCausalLM",
        "ArceeForCausalLM",
        "Cohere2MoeForCausalLM",
        "CwmForCausalLM",
        "DeepseekForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV41ForCausalLM",
        "DeepseekV4ForCausalLM",
        "Ernie4_5ForCausalLM",
        "FlexOlmoForCausalLM",
        "GPTBigCodeForCausalLM",
        "GPTNeoXForCausalLM",
        "Gemma4ForCausalLM",
        "GlmForCausalLM",
        "GlmMoeDsaForCausalLM",
        "GptOssForCausalLM",
        "GraniteForCausalLM",
        "GraniteSWAForCausalLM",
        "HunYuanDenseV1ForCausalLM",
        "HunYuanMoEV1ForCausalLM",
        "IQuestCoderForCausalLM",
        "InternLM3ForCausalLM",
        "Jais2ForCausalLM",
        "K2HorizonForCausalLM",
        "KimiLinearForCausalLM",
        "LLaMAForCausalLM",
        "LagunaForCausalLM",
        "Llama4ForCausalLM",
        "LlamaForCausalLM",
        "MellumForCausalLM",
        "MiMoForCausalLM",
        "MiMoV2FlashForCausalLM",
        "MiMoV2ForCausalLM",
        "MiniCPM3ForCausalLM",
        "MiniCPMForCausalLM",
        "MiniMaxM2ForCausalLM",
        "Ministral3ForCausalLM",
        "MistralForCausalLM",
        "MistralLarge3ForCausalLM",
        "NanbeigeForCausalLM",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
        "Olmo2ForCausalLM",
        "Olmo3ForCausalLM",
        "OlmoForCausalLM",
        "Phi3ForCausalLM",
        "PhiForCausalLM",
        "Plamo3ForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen3NextForCausalLM",
        "SarvamMLAForCausalLM",
        "SeedOssForCausalLM",
        "SmolLM3ForCausalLM",
        "Starcoder2ForCausalLM",
        "Step1ForCausalLM",
        "TeleChat2ForCausalLM",
        "TeleChat3ForCausalLM",
        "TeleFLMForCausalLM",
        "VaultGemmaForCausalLM",
    }
)


def serving_problem(
    architectures: Iterable[str], vllm_method: str, reads_aux_hidden_states: bool
) -> str | None:
    """Why vLLM cannot serve a ``vllm_method`` draft next to this target, or None."""
    archs = list(architectures)
    if not reads_aux_hidden_states or any(a in AUX_HIDDEN_STATE_TARGETS for a in archs):
        return None
    return (
        f"vLLM {VLLM_VERSION} cannot serve a method={vllm_method!r} draft next to a target of "
        f"architecture {', '.join(archs) or '(none in config.json)'}: its model class does not "
        "provide auxiliary hidden states, e.g. LlamaForCausalLM, "
        "Qwen3ForCausalLM, GptOssForCausalLM, MistralForCausalLM do; choose another target or "
        "an algorithm that reads only the last target layer"
    )
