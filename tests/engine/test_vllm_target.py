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


_AFTER_NUMBA = """
import json, sys
import llvmlite.binding  # what vLLM's n-gram proposer loads (with numba)
from eagle_train.engine import VllmEngine
from eagle_train.evaluate.harness import EngineProcess
try:
    VllmEngine(sys.argv[1], dtype="float32", max_model_len=512).open()
    refused = ""
except RuntimeError as exc:
    refused = str(exc)
kwargs = dict(model=sys.argv[1], dtype="float32", max_model_len=512)
with EngineProcess(kwargs) as engine:
    sampling = dict(temperature=0.0, max_tokens=int(sys.argv[3]), ignore_eos=True)
    got = engine.generate(json.loads(sys.argv[2]), sampling)
print(json.dumps({"refused": refused, "got": got}))
"""


def test_an_engine_starts_after_numba_is_loaded(tiny_world: Path) -> None:
    """vLLM 0.32 on CPU starts no engine in a process that has loaded llvmlite (its kernel
    registry reads vars() of llvmlite's library wrapper as a dict): an evaluation that ran
    the n-gram proposer in-process failed at its next engine. EngineProcess then opens the
    engine in a fresh process, and the engine's own open() names the cause in one line."""
    import subprocess
    import sys

    path = target_dir(tiny_world, "llama", "fp32")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompts = [[1, 5, 9, 200, 31], [1, 77, 3]]
    expected = [greedy(model, p, 12) for p in prompts]
    done = subprocess.run(
        [sys.executable, "-c", _AFTER_NUMBA, str(path), json.dumps(prompts), "12"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "llvmlite" in out["refused"]
    assert out["got"] == expected
