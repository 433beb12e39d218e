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

from eagle_train.config import Seed, StrictModel
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
from eagle_train.fsutil import (
    check_output_path,
    hold_lock,
    remove_empty_dirs,
    remove_stale_temporaries,
    topmost_missing,
)
from eagle_train.ownership import check_owned, owned_directory

log = logging.getLogger(__name__)

COMMAND, WHAT = "build-demo-world", "a demo world"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class DemoConfig(StrictModel):
    seed: Seed = 0
    """Seed of the corpus and of each target's initialisation and pretraining: the same seed
    builds the same world."""
    vocab_size: int = Field(2048, ge=300, le=1 << 20)
    """The demo tokenizer's vocabulary size (tokens; byte-level BPE: its 256 byte tokens and
    the special ones come first, so at least 300)."""
    num_tasks: int = Field(3000, ge=1)
    """Synthetic task chats (reverse words, sort numbers, upper-case, add) in the corpus."""
    reserved_ids: int = Field(0, ge=0, le=1 << 20)
    """Ids the tokenizer never produces, placed below its learned pieces (demo/tokenizer.py),
    as real tokenizers keep reserved ids: 32,512 put the 512 learned pieces of the tiny world
    above 32,767, where a real target's common tokens sit (a 16-bit id would wrap)."""
    max_stdlib_pairs: int = Field(3000, ge=0)
    """Chats made from Python standard-library functions (docstring -> code) at most."""
    max_stdlib_files: int | None = Field(None, ge=1)
    """Standard-library files read for them at most (None: all)."""
    val_fraction: float = Field(0.05, gt=0, lt=1)
    """Share of the chats held out as data/val.jsonl."""
    families: list[Family] = ["llama", "qwen3"]
    """Which demo targets to build: a Llama and/or a Qwen3."""
    shape: TargetShape = TargetShape()
    """The demo targets' architecture (both families share it)."""
    pretrain: PretrainConfig = PretrainConfig()
    """How the demo targets are pretrained on the corpus."""


def target_dir(world: str | Path, family: Family, dtype: str = "bf16") -> Path:
    return Path(world) / "targets" / family / dtype


def build_demo_world(cfg: DemoConfig, out_dir: str | Path, overwrite: bool = False) -> dict:
    """Build the world into ``out_dir`` (via a temporary sibling, renamed at the end)."""
    out = check_output_path(out_dir, "OUT")
    check_owned(out, "OUT", overwrite, COMMAND, WHAT)
    made = topmost_missing(out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with hold_lock(out.parent / f".{out.name}.lock", f"OUT {out}"):
            remove_stale_temporaries(out)  # left by a build that was killed
            check_owned(out, "OUT", overwrite, COMMAND, WHAT)
            with owned_directory(out, COMMAND, WHAT) as tmp:
                return _build_into(cfg, tmp)
    finally:  # a failed build leaves no parent directory it made
        if not out.exists():
            remove_empty_dirs(out.parent, made)


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
