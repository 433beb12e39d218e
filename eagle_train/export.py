"""Checkpoint -> a drafter directory stock vLLM serves, validated before anything is written.

vLLM checks far less than one would hope (a missing tensor stays uninitialised and acceptance
quietly collapses), so every name and shape is checked against the draft's contract first,
and the directory is written under a temporary name and renamed.
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, PretrainedConfig

import eagle_train
from eagle_train.checkpoint import load_draft_checkpoint
from eagle_train.drafts.base import DraftSpec, VllmDrafter
from eagle_train.drafts.contract import PROVENANCE_FILE, contract_problems
from eagle_train.drafts.registry import get_draft
from eagle_train.fsutil import atomic_directory
from eagle_train.run_config import DTYPES, RunConfig


class ExportError(ValueError):
    pass


def validate_drafter(spec: DraftSpec, drafter: VllmDrafter, target: PretrainedConfig) -> None:
    """Raise ExportError listing every missing, unexpected or mis-shaped tensor."""
    tensors = {n: (tuple(t.shape), t.dtype) for n, t in drafter.tensors.items()}
    problems = contract_problems(spec, drafter.config, tensors, target)
    if problems:
        raise ExportError("the drafter does not match vLLM's contract:\n  " + "\n  ".join(problems))


def export_draft(checkpoint: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Export a training checkpoint (``.../checkpoints/step-*``) as a vLLM drafter."""
    cfg, state, step = load_draft_checkpoint(checkpoint)
    source = {"checkpoint": str(Path(checkpoint).resolve()), "step": step}
    return export_state(state, cfg, out_dir, source, overwrite)


def export_state(
    state: dict[str, torch.Tensor],
    cfg: RunConfig,
    out_dir: str | Path,
    source: dict[str, Any],
    overwrite: bool = False,
) -> Path:
    """Validate ``state`` against vLLM's contract, cast to the target dtype, write atomically."""
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass --overwrite to replace it")
    target = AutoConfig.from_pretrained(cfg.target.path)
    spec = get_draft(cfg.draft.algorithm)
    drafter = spec.to_vllm(state, cfg.draft, target)
    validate_drafter(spec, drafter, target)
    dtype = DTYPES[cfg.target.dtype]  # the drafter ships in the target's dtype
    tensors = {
        name: (t.to(dtype) if t.is_floating_point() else t).contiguous()
        for name, t in sorted(drafter.tensors.items())
    }
    config = {**drafter.config, "dtype": cfg.target.dtype}
    provenance = {
        **source,
        "serving": {
            "method": drafter.method,
            "num_speculative_tokens": drafter.num_speculative_tokens,
            **drafter.extra_speculative_config,
        },
        "run_config": cfg.model_dump(mode="json"),
        "versions": versions(),
    }
    _write_atomic(out, config, tensors, provenance)
    return out


def serving_config(
    drafter_dir: str | Path, num_speculative_tokens: int | None = None
) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for an exported drafter (method always explicit)."""
    info = json.loads((Path(drafter_dir) / PROVENANCE_FILE).read_text())["serving"]
    spec = {**info, "model": str(drafter_dir)}
    if num_speculative_tokens is not None:
        spec["num_speculative_tokens"] = num_speculative_tokens
    return spec


def versions() -> dict[str, str | None]:
    return {
        "eagle_train": eagle_train.__version__,
        "git_revision": git_revision(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def _write_atomic(out: Path, config: dict, tensors: dict, provenance: dict) -> None:
    with atomic_directory(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
