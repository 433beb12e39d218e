"""The regeneration engine is sized so that every running request fits the KV cache whole
(vLLM never preempts and recomputes a sequence). Checked against figures vLLM itself
printed, not against the sizing code: on SmolLM2-135M (30 layers, 3 KV heads of 64, bf16)
vLLM 0.32's CPU backend reported 91 blocks of 128 tokens in a 256 MiB cache."""

from __future__ import annotations

import json

import pytest
from realistic import COUNTS, lengths, not_a_multiple

from eagle_train.engine import (
    CPU_KV_CACHE_BYTES,
    kv_bytes_per_token,
    preemption_free_size,
)

SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
}
VLLM_BLOCKS_IN_256_MIB = 91  # vLLM's own log line for SmolLM2 on CPU (2026-12-01)


@pytest.fixture
def smollm2_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return tmp_path


def test_kv_bytes_per_token_agrees_with_vllms_block_count(smollm2_config):
    per_token = kv_bytes_per_token(smollm2_config, "bfloat16")
    assert 256 * 2**20 // (per_token * 128) == VLLM_BLOCKS_IN_256_MIB
    assert kv_bytes_per_token(smollm2_config, "float32") == 2 * per_token


def test_nested_text_config_is_read(tmp_path):
    """A multimodal checkpoint keeps the text model's shape under text_config."""
    nested = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"]}
    nested["text_config"] = SMOLLM2 | {"num_hidden_layers": 10}
    (tmp_path / "config.json").write_text(json.dumps(nested))
    assert kv_bytes_per_token(tmp_path, "bfloat16") == 2 * 10 * 3 * 64 * 2


def test_cpu_default_holds_every_running_request_whole():
    per_token = 2 * 30 * 3 * 64 * 2
    size = preemption_free_size(None, None, 512, per_token, cuda=False)
    assert size.max_num_seqs is not None and size.kv_cache_memory_bytes is not None
    # 512 tokens = 4 whole blocks of 128 per request, for every sequence scheduled at once
    assert size.kv_cache_memory_bytes >= size.max_num_seqs * 4 * 128 * per_token
    assert size.kv_cache_memory_bytes >= CPU_KV_CACHE_BYTES


def test_a_given_cache_sets_the_concurrency():
    per_token = 2 * 30 * 3 * 64 * 2
    # 256 MiB holds 91 blocks; requests of up to 512 tokens take 4 blocks each: 22 fit
    size = preemption_free_size(None, 256 * 2**20, 512, per_token, cuda=False)
    assert size == (22, 256 * 2**20)
    # a request longer than the cache still gets one slot (vLLM refuses it at start-up)
    assert preemption_free_size(None, 2**20, 4096, per_token, cuda=False).max_num_seqs == 1


def test_a_given_concurrency_sizes_the_cache_and_both_given_are_kept():
    size = preemption_free_size(8, None, 300, 1000, cuda=False)
    assert size == (8, max(CPU_KV_CACHE_BYTES, 8 * 384 * 1000))  # 300 -> 3 blocks of 128
    assert preemption_free_size(100, 10**6, 300, 1000, cuda=False) == (100, 10**6)


def test_cuda_keeps_vllms_sizing_unless_a_cache_is_given():
    assert preemption_free_size(None, None, 512, 1000, cuda=True) == (None, None)
    assert preemption_free_size(64, None, 512, 1000, cuda=True) == (64, None)
    assert preemption_free_size(None, 10**9, 512, 1000, cuda=True).max_num_seqs == 10**9 // (
        512 * 1000
    )


def test_lengths_that_are_not_whole_blocks_round_up():
    """Requests of lengths no block size divides (tests/realistic.py) take their last,
    partial block whole; concurrency large enough that the cache is above the CPU floor."""
    per_token = 2 * 30 * 3 * 64 * 2  # SmolLM2 bf16
    for length in lengths(5):
        assert not_a_multiple(length, 128)
        blocks = -(-length // 128)  # by hand: ceil
        size = preemption_free_size(COUNTS[4] * 64, None, length, per_token, cuda=False)
        want = COUNTS[4] * 64 * blocks * 128 * per_token
        assert want > CPU_KV_CACHE_BYTES
        assert size == (COUNTS[4] * 64, want)
        # a given cache: as many requests as it holds whole (91 blocks in 256 MiB)
        given = preemption_free_size(None, 256 * 2**20, length * 5, per_token, cuda=False)
        assert given.max_num_seqs == VLLM_BLOCKS_IN_256_MIB // -(-(length * 5) // 128)
