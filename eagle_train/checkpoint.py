"""Checkpoints: one directory per step, written to a temporary name and renamed.

``step-0000100/`` holds ``draft.safetensors`` (parameters and buffers such as d2t/t2d),
``optimizer.pt`` (fp32 masters and moments), ``scheduler.pt``, ``trainer_state.json``
(step, data position) and ``config.yaml`` (the resolved run config). A directory without
``trainer_state.json`` (written last) is incomplete.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from eagle_train.config import dump_config, load_config
from eagle_train.data.loader import LoaderState
from eagle_train.fsutil import atomic_directory
from eagle_train.run_config import RunConfig

STATE_FILE = "trainer_state.json"


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def save_checkpoint(
    root: Path,
    step: int,
    draft: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    cfg: RunConfig,
    loader: LoaderState,
    keep_last: int,
) -> Path:
    final = root / checkpoint_name(step)
    with atomic_directory(final) as tmp:
        state = {k: v.detach().contiguous() for k, v in draft.state_dict().items()}
        save_file(state, str(tmp / "draft.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        dump_config(cfg, tmp / "config.yaml")
        trainer = {"step": step, "loader": asdict(loader)}
        (tmp / STATE_FILE).write_text(json.dumps(trainer, indent=2))
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def load_draft_checkpoint(path: str | Path) -> tuple[RunConfig, dict[str, torch.Tensor], int]:
    """(run config, draft state dict, step) of a checkpoint directory, for export."""
    path = Path(path)
    missing = [f for f in ("draft.safetensors", "config.yaml", STATE_FILE)
               if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{path}: not a complete checkpoint (missing {', '.join(missing)})")
    cfg = load_config(RunConfig, path / "config.yaml")
    state = load_file(str(path / "draft.safetensors"))
    step = json.loads((path / STATE_FILE).read_text())["step"]
    return cfg, state, step

