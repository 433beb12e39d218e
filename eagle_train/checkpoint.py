"""Checkpoints: everything needed to continue a run bit-exactly, written atomically.

``step-0000100/`` holds
- ``draft.safetensors``: parameters and buffers (d2t/t2d) in the draft's dtype;
- ``optimizer.pt``: fp32 masters and moments, keyed by parameter name; ``scheduler.pt``;
- ``rng_states.pt``: every rank's torch (and CUDA) and Python RNG states, in rank order;
- ``vocab.safetensors``: the draft vocabulary mapping, when the run has one;
- ``config.yaml``: the resolved run config;
- ``trainer_state.json``, written last: step, data position, world size, skip count, and
  the size and sha256 of every other file. A directory without it is incomplete; a file
  whose size or hash differs is truncated or corrupt. Both are skipped on resume.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eagle_train.config import dump_config, read_yaml, validate_config
from eagle_train.data.loader import LoaderState
from eagle_train.data.vocab import (
    VOCAB_FILE,
    VocabMapping,
    load_vocab_mapping,
    save_vocab_mapping,
)
from eagle_train.errors import UserError
from eagle_train.fsutil import atomic_directory, confined, is_disk_full
from eagle_train.run_config import RunConfig

log = logging.getLogger(__name__)
STATE_FILE = "trainer_state.json"
DRAFT_FILE = "draft.safetensors"
RNG_FILE = "rng_states.pt"


class CheckpointError(UserError, RuntimeError):
    pass


@dataclass
class TrainerState:
    step: int
    loader: LoaderState
    world_size: int = 1
    skipped_steps: int = 0
    best_acceptance: float | None = None
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> bytes, sha256

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        """The state, its types checked: a ``TypeError`` or ``ValueError`` names the field."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("loader"), dict):
            raise TypeError("expected a JSON object with a 'loader' object")
        state = cls(**{**raw, "loader": LoaderState(**raw["loader"])})
        _check_state_types(state)
        return state


def _check_state_types(state: TrainerState) -> None:
    ints = {"step": state.step, "world_size": state.world_size}
    ints |= {"skipped_steps": state.skipped_steps, "loader.epoch": state.loader.epoch}
    ints["loader.offset"] = state.loader.offset
    for key, value in ints.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TypeError(f"'{key}' must be a non-negative integer, got {value!r}")
    if state.best_acceptance is not None and not isinstance(state.best_acceptance, int | float):
        raise TypeError(f"'best_acceptance' must be a number, got {state.best_acceptance!r}")
    if not isinstance(state.files, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)
        for e in state.files.values()
    ):
        raise TypeError("'files' must map each file name to its 'bytes' (int) and 'sha256'")


@dataclass
class Resumed:
    """A checkpoint read back for continuing: all tensors on CPU."""

    path: Path
    state: TrainerState
    config: RunConfig
    draft: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng_states: list[dict[str, Any]]
    vocab: VocabMapping | None


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def capture_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(
    root: Path,
    draft: dict[str, torch.Tensor],
    optimizer: dict[str, Any],
    scheduler: Any,
    cfg: RunConfig,
    state: TrainerState,
    rng_states: list[dict[str, Any]],
    vocab: VocabMapping | None,
    keep_last: int,
) -> Path:
    final = root / checkpoint_name(state.step)
    try:
        with atomic_directory(final) as tmp:
            tensors = {k: v.detach().contiguous() for k, v in draft.items()}
            save_file(tensors, str(tmp / DRAFT_FILE))
            _save_torch(optimizer, tmp / "optimizer.pt")
            _save_torch(scheduler.state_dict(), tmp / "scheduler.pt")
            _save_torch(rng_states, tmp / RNG_FILE)
            if vocab is not None:
                save_vocab_mapping(vocab, tmp / VOCAB_FILE)
            dump_config(cfg, tmp / "config.yaml")
            state.files = {p.name: _fingerprint(p) for p in sorted(tmp.iterdir())}
            (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
    except Exception as exc:  # the partial directory is already removed
        if not is_disk_full(exc):
            raise
        intact = list_checkpoints(root)
        raise CheckpointError(
            f"no space left on device while writing {final} (the partial write was removed); "
            f"the last intact checkpoint is {intact[-1] if intact else 'none'}: free space "
            "and rerun with --resume auto"
        ) from None
    for old in list_checkpoints(root)[:-keep_last]:
        if old.is_symlink():  # not this run's to delete (nor what it points to)
            log.warning("keeping %s: a symlink, not a checkpoint this run wrote", old)
        else:
            shutil.rmtree(old)
    return final


def _save_torch(obj: Any, path: Path) -> None:
    """``torch.save`` through a Python file whose write errors are kept: torch's writer turns
    a full disk into an anonymous ``RuntimeError`` ("unexpected pos ..."), and the
    ``OSError(ENOSPC)`` behind it is raised instead."""
    with open(path, "wb") as f:
        writer = _FailedWriteKeeper(f)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None
            raise


class _FailedWriteKeeper:
    """A binary file whose first failed write is remembered (``error``)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.error: OSError | None = None

    @property
    def name(self) -> str:  # the file's path, as a file object has it
        return self.f.name

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.f.flush()


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under ``root`` that finished writing, oldest first."""
    return [p for p in _step_dirs(root) if (p / STATE_FILE).is_file()]


def checkpoint_problems(path: Path) -> list[str]:
    """Why ``path`` cannot be resumed from (empty when it is complete and intact)."""
    path = Path(path)
    if not path.is_dir():
        return [f"{path}: {'not a directory' if path.exists() else 'does not exist'}"]
    if not (path / STATE_FILE).is_file() and _step_dirs(path / "checkpoints"):
        newest = _step_dirs(path / "checkpoints")[-1]
        return [
            f"{path} is a run directory, not a checkpoint: pass one of its checkpoints, e.g. {newest}"
        ]
    if not (path / STATE_FILE).is_file():
        return [f"{path}: incomplete (no {STATE_FILE}; the writer was interrupted)"]
    try:
        state = TrainerState.from_json((path / STATE_FILE).read_text())
    except (ValueError, TypeError, KeyError) as exc:
        return [f"{path / STATE_FILE}: unreadable ({exc})"]
    required = {DRAFT_FILE, "optimizer.pt", "scheduler.pt", RNG_FILE, "config.yaml"}
    unlisted = sorted(required - state.files.keys())
    if unlisted:  # written by an older version, without the manifest exact resume needs
        return [f"{path}: {STATE_FILE} does not record {', '.join(unlisted)}"]
    problems = []
    for name, expected in state.files.items():
        file = confined(path, name, path / STATE_FILE)
        if not file.is_file():
            problems.append(f"{file}: missing")
            continue
        size = file.stat().st_size
        if size != expected["bytes"]:
            problems.append(f"{file}: {size} bytes, expected {expected['bytes']} (truncated?)")
        elif _sha256(file) != expected["sha256"]:
            problems.append(f"{file}: sha256 differs from the one recorded (corrupt)")
    return problems


def newest_intact(root: Path) -> Path | None:
    """The newest intact checkpoint under ``root`` (None when there is none); damaged ones
    are skipped with a warning."""
    for path in reversed(_step_dirs(root)):
        found = checkpoint_problems(path)
        if not found:
            return path
        log.warning("skipping checkpoint %s: %s", path, "; ".join(found))
    return None


def find_resumable(root: Path) -> Path | None:
    """The newest intact checkpoint under ``root``; damaged ones are skipped with a warning.
    None when there are no checkpoints at all; an error when all of them are damaged."""
    candidates = _step_dirs(root)
    problems: list[str] = []
    for path in reversed(candidates):
        found = checkpoint_problems(path)
        if not found:
            return path
        log.warning("skipping checkpoint %s: %s", path.name, "; ".join(found))
        problems += found
    if candidates:
        raise CheckpointError(f"no usable checkpoint under {root}:\n  " + "\n  ".join(problems))
    return None


def load_for_resume(path: Path) -> Resumed:
    """Read a checkpoint that ``find_resumable`` or ``checkpoint_problems`` passed (hashing
    every file again on every rank would only repeat that work)."""
    vocab_file = path / VOCAB_FILE
    return Resumed(
        path=path,
        state=TrainerState.from_json((path / STATE_FILE).read_text()),
        config=stored_config(path),
        draft=read_tensors(path / DRAFT_FILE),
        optimizer=read_pickle(path / "optimizer.pt"),
        scheduler=read_pickle(path / "scheduler.pt"),
        rng_states=read_pickle(path / RNG_FILE),
        vocab=load_vocab_mapping(vocab_file) if vocab_file.is_file() else None,
    )


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file; a bad header is a ``CheckpointError`` naming it."""
    try:
        return load_file(str(path))
    except Exception as exc:  # SafetensorError (a bad header), not an OSError
        if isinstance(exc, OSError):
            raise
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def read_pickle(path: Path) -> Any:
    """A checkpoint's torch file, read with ``weights_only=True`` explicitly
    (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 only overrides calls that leave it unset, so a crafted
    pickle never runs); refused in one line naming the file when it holds anything else."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{path}: refused: not a checkpoint file this version wrote (a torch weights-only "
            f"load failed: {why[:200]})"
        ) from None


# draft.layer_style of a checkpoint written before it became draft.qk_norm.
_QK_NORM_OF_LAYER_STYLE = {"auto": None, "llama": False, "qwen3": True}
# optim settings a checkpoint held before they were removed, with the one value they stand
# for now (AdamW, no momentum).
_REMOVED_OPTIM = {"name": "adamw", "momentum": 0.0}


def stored_config(path: Path) -> RunConfig:
    """A checkpoint's run config, read as if written now where an older version wrote it:
    ``data.draft_vocab_size`` (null unless set) moved to the draft that has a vocabulary
    (``draft.draft_vocab_size``), ``draft.layer_style`` became ``draft.qk_norm``, and
    ``optim.name: adamw`` and ``optim.momentum: 0.0`` (AdamW, the only optimizer) went."""
    file = path / "config.yaml"
    data, lines = read_yaml(file)
    section = data.get("data")
    size = section.pop("draft_vocab_size", None) if isinstance(section, dict) else None
    draft = data.get("draft")
    if size is not None and isinstance(draft, dict) and "draft_vocab_size" not in draft:
        draft["draft_vocab_size"] = size
    style = draft.get("layer_style") if isinstance(draft, dict) else None
    if style in _QK_NORM_OF_LAYER_STYLE and "qk_norm" not in draft:
        draft.pop("layer_style")
        draft["qk_norm"] = _QK_NORM_OF_LAYER_STYLE[style]
    optim = data.get("optim")
    for key, only in _REMOVED_OPTIM.items():  # dump_config wrote them with their defaults
        if isinstance(optim, dict) and optim.get(key, only) == only:
            optim.pop(key, None)
    return validate_config(RunConfig, data, str(file), lines)


def load_draft_checkpoint(path: str | Path) -> tuple[RunConfig, dict[str, torch.Tensor], int]:
    """(run config, draft state dict, step) of a checkpoint directory, for export."""
    path = Path(path)
    problems = checkpoint_problems(path)
    if problems:
        raise CheckpointError(f"{path}: not a usable checkpoint: " + "; ".join(problems))
    cfg = stored_config(path)
    state = read_tensors(path / DRAFT_FILE)
    step = TrainerState.from_json((path / STATE_FILE).read_text()).step
    return cfg, state, step


def _step_dirs(root: Path) -> list[Path]:
    if not Path(root).is_dir():
        return []
    found = [p for p in Path(root).glob("step-*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def _fingerprint(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()
