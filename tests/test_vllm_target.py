"""The demo target serves in real vLLM and matches transformers greedy decoding (fp32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle_train.demo.build import target_dir

pytestmark = pytest.mark.vllm


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], num_new: int) -> list[int]:
    """Plain argmax decoding that, like vLLM's ignore_eos, runs past eos (generate's
    min_new_tokens would instead forbid eos and change the continuation)."""
    ids = list(prompt)
    for _ in range(num_new):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_vllm_greedy_matches_transformers(tiny_world: Path, family: str) -> None:
    from eagle_train.engine import VllmEngine

    path = target_dir(tiny_world, family, "fp32")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    chats = [
        json.loads(line) for line in (tiny_world / "data" / "val.jsonl").read_text().splitlines()
    ]
    prompts = [
        tok.apply_chat_template(
            c["messages"][:1], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for c in chats[:4]
    ]
    num_new = 24
    expected = [greedy(model, ids, num_new) for ids in prompts]
    with VllmEngine(path, dtype="float32", max_model_len=512) as engine:
        got = engine.generate_greedy(prompts, max_new_tokens=num_new, ignore_eos=True)
    assert got == expected
