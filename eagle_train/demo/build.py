"""Build the demo world (tokenizer, targets, chat data) in one deterministic, atomic step.

Layout of the output directory::

    world.json                      what was built: config, sizes, losses, versions
    tokenizer/                      HF tokenizer (byte-level BPE, chat template)
    data/train.jsonl, data/val.jsonl   OpenAI `messages` chat records
    targets/<family>/{fp32,bf16}/   `save_pretrained` targets with the tokenizer beside them

Everything downstream loads these through ``from_pretrained`` and the data pipeline, the same
code paths a real target (e.g. Llama-3.1-8B) and a real dataset (e.g. ShareGPT) take.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from pathlib import Path

import torch
import transformers
from pydantic import Field

from eagle_train.config import StrictModel
from eagle_train.demo.corpus import build_corpus, split_corpus
from eagle_train.demo.targets import (
    Family,
    PretrainConfig,
    TargetShape,
    build_target,
    pack_tokens,
    pretrain,
    save_target,
)
from eagle_train.demo.tokenizer import reserved_range, train_tokenizer
from eagle_train.fsutil import atomic_directory, check_output_path, check_replaceable

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class DemoConfig(StrictModel):
    seed: int = 0
    vocab_size: int = 2048  # pieces the tokenizer learns (specials and the byte alphabet in)
    # ids the tokenizer never produces, below the learned pieces (demo/tokenizer.py): the
    # tests' world sets enough to put the learned pieces above 32,767
    reserved_ids: int = Field(0, ge=0)
    num_tasks: int = 3000
    max_stdlib_pairs: int = 3000
    max_stdlib_files: int | None = None
    val_fraction: float = Field(0.05, gt=0, lt=1)
    families: list[Family] = ["llama", "qwen3"]
    shape: TargetShape = TargetShape()
    pretrain: PretrainConfig = PretrainConfig()


def target_dir(world: str | Path, family: Family, dtype: str = "bf16") -> Path:
    return Path(world) / "targets" / family / dtype


def build_demo_world(cfg: DemoConfig, out_dir: str | Path, overwrite: bool = False) -> dict:
    """Build the world into ``out_dir`` (via a temporary sibling, renamed at the end)."""
    out = check_output_path(out_dir, "OUT")
    check_replaceable(out, "OUT", overwrite, lambda p: (p / "world.json").is_file(), "a demo world")
    with atomic_directory(out) as tmp:
        return _build_into(cfg, tmp)


def _build_into(cfg: DemoConfig, root: Path) -> dict:
    start = time.perf_counter()
    records = build_corpus(cfg.seed, cfg.num_tasks, cfg.max_stdlib_pairs, cfg.max_stdlib_files)
    train, val = split_corpus(records, cfg.val_fraction)
    (root / "data").mkdir()
    for name, chats in (("train", train), ("val", val)):
        with open(root / "data" / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in chats)
    log.info("corpus: %d train / %d val chats", len(train), len(val))

    texts = [m["content"] for r in train for m in r["messages"]]
    tokenizer = train_tokenizer(texts, cfg.vocab_size, cfg.reserved_ids)
    tokenizer.save_pretrained(root / "tokenizer")

    rendered = [tokenizer.apply_chat_template(r["messages"], tokenize=False) for r in train]
    rows = pack_tokens(rendered, tokenizer, cfg.pretrain.seq_len)
    targets = {}
    for i, family in enumerate(cfg.families):
        model = build_target(family, cfg.shape, tokenizer, cfg.seed + i)
        loss = pretrain(model, rows, cfg.pretrain, cfg.seed + i, reserved_range(cfg.reserved_ids))
        for name, dtype in DTYPES.items():
            save_target(model, tokenizer, target_dir(root, family, name), dtype)
        targets[family] = {
            "final_pretrain_loss": loss,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "paths": {name: str(target_dir(".", family, name)) for name in DTYPES},
        }
    summary = {
        "config": cfg.model_dump(mode="json"),
        "num_train_chats": len(train),
        "num_val_chats": len(val),
        "num_pretrain_tokens": rows.numel(),
        "tokenizer_vocab": len(tokenizer),
        "targets": targets,
        "build_seconds": round(time.perf_counter() - start, 1),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    (root / "world.json").write_text(json.dumps(summary, indent=2))
    return summary
