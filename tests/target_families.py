"""Tiny random-initialised targets of every supported family, built from HF configs (a few
layers; MoE with a few experts), with hand-written expectations of what their description
must say. Shared by the fast description tests and the slow train-export-serve tests."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import transformers as T
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, PretrainedConfig

VOCAB = 512  # the tiny demo world's tokenizer
WIDE_VOCAB = 33_024  # the wide world's (tests/conftest.py: 32,512 reserved ids below its pieces)
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 4, 64, 2, 1, 32  # head_dim 32: vLLM CPU kernels
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=128,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    # peaked logits: greedy decoding is not decided by fp32 rounding between near-ties
    initializer_range=0.2,
)
_YARN = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 128,
}


def family_config(family: str, vocab: int = VOCAB) -> PretrainedConfig:
    c = {**_COMMON, "vocab_size": vocab}
    if family == "llama":
        return T.LlamaConfig(**c, head_dim=HEAD_DIM)
    if family == "mistral":
        return T.MistralConfig(**c, head_dim=HEAD_DIM, sliding_window=None)
    if family == "qwen2":
        return T.Qwen2Config(**c)
    if family == "qwen3":
        return T.Qwen3Config(**c, head_dim=HEAD_DIM)
    if family == "qwen3_moe":
        return T.Qwen3MoeConfig(
            **c, head_dim=HEAD_DIM, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64
        )
    if family == "gpt_oss":
        c = {**c, "tie_word_embeddings": False}
        return T.GptOssConfig(
            **c,
            head_dim=HEAD_DIM,
            num_local_experts=4,
            num_experts_per_tok=2,
            rope_parameters=dict(_YARN),
            sliding_window=64,
        )
    if family == "qwen2_5_vl":
        text = {k: v for k, v in c.items() if k != "tie_word_embeddings"}
        rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]}
        return T.Qwen2_5_VLConfig(
            text_config={**text, "rope_parameters": rope},
            vision_config=dict(
                depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=HIDDEN
            ),
            image_token_id=VOCAB - 3,
            video_token_id=VOCAB - 4,
            vision_start_token_id=VOCAB - 5,
            tie_word_embeddings=False,
        )
    raise ValueError(family)


# What each description must say, written by hand from the configs above.
EXPECTED: dict[str, dict[str, Any]] = {
    "llama": dict(architecture="LlamaForCausalLM", qk_norm=False, num_experts=0),
    "mistral": dict(architecture="MistralForCausalLM", qk_norm=False, num_experts=0),
    "qwen2": dict(architecture="Qwen2ForCausalLM", qk_norm=False, num_experts=0),
    "qwen3": dict(architecture="Qwen3ForCausalLM", qk_norm=True, num_experts=0),
    "qwen3_moe": dict(architecture="Qwen3MoeForCausalLM", qk_norm=True, num_experts=4),
    "gpt_oss": dict(architecture="GptOssForCausalLM", qk_norm=False, num_experts=4),
    "qwen2_5_vl": dict(
        architecture="Qwen2_5_VLForConditionalGeneration",
        qk_norm=False,
        num_experts=0,
        text_config_key="text_config",
        model_type="qwen2_5_vl_text",
    ),
}
FAMILIES = sorted(EXPECTED)


def build_family_target(
    family: str, out: Path, tokenizer_dir: Path | None, seed: int = 0, vocab: int = VOCAB
) -> Path:
    """save_pretrained a random-init fp32 target of ``family`` (with the tokenizer), its
    vocabulary ``vocab`` ids."""
    config = family_config(family, vocab)
    auto = AutoModelForImageTextToText if family == "qwen2_5_vl" else AutoModelForCausalLM
    torch.manual_seed(seed)
    model = auto.from_config(config).float()
    model.save_pretrained(out)
    if tokenizer_dir is not None:
        for f in tokenizer_dir.iterdir():
            if f.is_file() and f.name not in ("config.json", "generation_config.json"):
                shutil.copy(f, out / f.name)
    return out
