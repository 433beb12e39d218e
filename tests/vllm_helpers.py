"""Shared by the end-to-end vLLM tests: held-out prompts of the tiny world, serving an
export next to the fp32 target, and training + exporting a draft from a shipped config."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from eagle_train.config import load_config
from eagle_train.data.loader import PreparedData
from eagle_train.drafts.registry import get_draft
from eagle_train.export import export_draft, export_state, serving_config
from eagle_train.run_config import RunConfig
from eagle_train.serving import VllmEngine
from eagle_train.target import FrozenTarget
from eagle_train.train import train

REPO = Path(__file__).resolve().parents[1]


def held_out_prompts(world: Path, family: str, num_prompts: int) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(world / "targets" / family / "fp32")
    chats = [json.loads(line) for line in (world / "data" / "val.jsonl").read_text().splitlines()]
    return [tok.apply_chat_template(c["messages"][:1], add_generation_prompt=True, tokenize=True,
                                    return_dict=True)["input_ids"] for c in chats[:num_prompts]]


def serve(
    target: Path, prompts: list[list[int]], drafter: Path | None, k: int, max_new: int
) -> tuple[list[list[int]], float]:
    """Greedy tokens and the acceptance length from vLLM's counters (1.0 without drafter)."""
    # Stop at eos, as served: past eos the target rambles off the distribution a draft is
    # trained on (its own answers), which would measure something no user sees.
    sampling = dict(temperature=0.0, max_tokens=max_new)
    spec = serving_config(drafter, k) if drafter else None
    with VllmEngine(target, dtype="float32", max_model_len=512, speculative_config=spec) as e:
        results = e.generate_one_by_one(prompts, sampling)
    tokens = [r[0] for r in results]
    drafts = sum(r[1].drafts for r in results)
    accepted = sum(r[1].accepted for r in results)
    return tokens, (1 + accepted / drafts if drafts else 1.0)


def train_and_export(
    config_name: str, world: Path, family: str, data: Path, root: Path, overrides: list[str]
) -> dict:
    """Train with ``configs/train/<config_name>.yaml`` on the tiny world, export the last
    checkpoint and a random-init draft of the same shape (seed 1)."""
    base = [f"target.path={world / 'targets' / family / 'bf16'}", f"data.train={data}",
            "data.val=null", "data.max_length=128", f"train.output_dir={root / 'run'}",
            "train.progress=false", "train.tensorboard=false"]
    cfg = load_config(RunConfig, REPO / "configs" / "train" / f"{config_name}.yaml",
                      base + overrides)
    checkpoint = train(cfg).last_checkpoint
    spec = get_draft(cfg.draft.algorithm)
    target = FrozenTarget.from_pretrained(cfg.target.path)
    torch.manual_seed(1)
    random_state = spec.build(cfg.draft, target, PreparedData(data).vocab).state_dict()
    return {
        "family": family, "cfg": cfg, "checkpoint": checkpoint,
        "drafter": export_draft(checkpoint, root / "drafter"),
        "random": export_state(random_state, cfg, root / "random", {"step": 0}),
        "run": root / "run",
    }
