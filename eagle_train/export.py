"""Checkpoint -> a drafter directory stock vLLM serves, validated before anything is written.

vLLM checks far less than one would hope (a missing tensor stays uninitialised and acceptance
quietly collapses), so every name and shape is checked against the draft's contract first,
and the directory is written under a temporary name and renamed. Two formats: vLLM's native
one (default; served with ``--speculative-config``) and the vllm-project/speculators one
(``speculators_config`` in config.json: ``vllm serve DRAFTER_DIR`` finds the target and the
method in the drafter). Every export carries a model card (README.md).
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Any, Literal

import torch
import transformers
from safetensors.torch import save_file

import eagle_train
from eagle_train.checkpoint import load_draft_checkpoint
from eagle_train.drafts.base import DraftSpec, VllmDrafter
from eagle_train.drafts.contract import PROVENANCE_FILE, contract_problems
from eagle_train.drafts.registry import check_servable, get_draft
from eagle_train.errors import UserError
from eagle_train.fsutil import (
    UnsafePathError,
    check_no_overlap,
    check_output_path,
    confined,
    hold_lock,
    naming_disk_full,
    remove_stale_temporaries,
)
from eagle_train.model_card import CARD_FILE, EXPORT_COMMAND, render_card
from eagle_train.ownership import check_owned, owned_directory
from eagle_train.run_config import DTYPES, RunConfig
from eagle_train.target_model import TargetDescription, TargetError, load_target_description

ExportFormat = Literal["vllm", "speculators"]
# What every export writes (its provenance file lists them; exports from before the list
# wrote these).
EXPORT_FILES = sorted(("config.json", "model.safetensors", PROVENANCE_FILE, CARD_FILE))
COMMAND = EXPORT_COMMAND


class ExportError(UserError, ValueError):
    pass


def validate_drafter(spec: DraftSpec, drafter: VllmDrafter, target: TargetDescription) -> None:
    """Raise ExportError listing every missing, unexpected or mis-shaped tensor."""
    tensors = {n: (tuple(t.shape), t.dtype) for n, t in drafter.tensors.items()}
    problems = contract_problems(spec, drafter.config, tensors, target)
    if problems:
        raise ExportError("the drafter does not match vLLM's contract:\n  " + "\n  ".join(problems))


def export_draft(
    checkpoint: str | Path,
    out_dir: str | Path,
    overwrite: bool = False,
    fmt: ExportFormat = "vllm",
    verifier: str | None = None,
) -> Path:
    """Export a training checkpoint (``.../checkpoints/step-*``) as a vLLM drafter. OUT is
    refused when it is, holds or lies inside the checkpoint (replacing it would delete the
    run), and replaced only when it is an earlier export or empty."""
    out = check_output_path(out_dir, "OUT_DIR")
    check_no_overlap(out, "OUT_DIR", [("checkpoint", Path(checkpoint))])
    check_replaceable_export(out, overwrite)
    cfg, state, step = load_draft_checkpoint(checkpoint)
    source = {"checkpoint": str(Path(checkpoint).resolve()), "step": step}
    return export_state(state, cfg, out_dir, source, overwrite, fmt, verifier, stored_config=True)


def export_state(
    state: dict[str, torch.Tensor],
    cfg: RunConfig,
    out_dir: str | Path,
    source: dict[str, Any],
    overwrite: bool = False,
    fmt: ExportFormat = "vllm",
    verifier: str | None = None,
    stored_config: bool = False,
) -> Path:
    """Validate ``state`` against vLLM's contract, cast to the target dtype, write atomically.
    ``verifier``: the target name recorded for serving (default: the training target path).
    ``stored_config``: ``cfg`` was read from disk beside ``state`` (a checkpoint), so it must
    describe the tensors (``check_config_matches_tensors``)."""
    out = Path(out_dir)
    check_replaceable_export(out, overwrite)
    target = load_target_description(cfg.target.path, "target.path (of the run config)")
    spec = get_draft(cfg.draft.algorithm)
    try:
        check_servable(spec, target)
    except TargetError as exc:
        raise ExportError(str(exc)) from None
    drafter = spec.to_vllm(state, cfg.draft, target)
    if stored_config:
        check_config_matches_tensors(cfg, drafter.config, source)
    validate_drafter(spec, drafter, target)
    dtype = DTYPES[cfg.target.dtype]  # the drafter ships in the target's dtype
    config = {**drafter.config, "dtype": cfg.target.dtype}
    name = verifier or str(cfg.target.path)
    tensors = dict(drafter.tensors)
    if fmt == "speculators":
        config = speculators_config(spec, drafter, config, target, name)
        tensors.update(drafter.speculators.extra_tensors)  # type: ignore[union-attr]
    tensors = {
        n: (t.to(dtype) if t.is_floating_point() else t).contiguous()
        for n, t in sorted(tensors.items())
    }
    provenance = {
        **source,
        "format": fmt,
        "target": {
            "name_or_path": name,
            "architecture": target.architecture,
            "num_layers": target.num_layers,
            "hidden_size": target.hidden_size,
            "layer_ids": spec.target_layer_ids(cfg.draft, target),
        },
        "serving": {
            "method": drafter.method,
            "num_speculative_tokens": drafter.num_speculative_tokens,
            **drafter.extra_speculative_config,
        },
        # vLLM's native config.json, kept for validation when config.json is another format
        "vllm_config": {**drafter.config, "dtype": cfg.target.dtype},
        "run_config": cfg.model_dump(mode="json"),
        "versions": versions(),
        "files": EXPORT_FILES,  # what --overwrite may replace; anything else is the user's
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with hold_lock(out.parent / f".{out.name}.lock", f"export {out}"):
        remove_stale_temporaries(out)  # left by an export that was killed
        check_replaceable_export(out, overwrite)
        with naming_disk_full(out, "the export"):
            _write_atomic(out, config, tensors, provenance)
    return out


def check_config_matches_tensors(cfg: RunConfig, config: dict, source: dict[str, Any]) -> None:
    """The run config stored with the weights describes them: a draft vocabulary size in the
    config that differs from the tensors' would be exported with contradictory provenance
    (its run_config saying one size, config.json the other)."""
    asked = getattr(cfg.draft, "draft_vocab_size", None)
    found = config.get("draft_vocab_size", config.get("vocab_size"))
    if asked is not None and found is not None and asked != found:
        where = source.get("checkpoint", "the checkpoint")
        raise ExportError(
            f"{where}: its config sets draft.draft_vocab_size {asked}, but its tensors hold a "
            f"draft vocabulary of {found}: the config and the weights are from different runs"
        )


def speculators_config(
    spec: DraftSpec,
    drafter: VllmDrafter,
    native: dict[str, Any],
    target: TargetDescription,
    verifier: str,
) -> dict[str, Any]:
    """config.json in the vllm-project/speculators format: the algorithm's fields at the top,
    the decoder layers' config under ``transformer_layer_config``, and ``speculators_config``
    naming the verifier (the target) and the number of drafted tokens."""
    fmt = drafter.speculators
    if fmt is None:
        raise ExportError(
            f"vLLM reads no speculators-format drafter for a {spec.name!r} draft "
            f"(method {drafter.method!r}): export it with --format vllm"
        )
    dropped = {"architectures", "dtype", *fmt.moved}
    layer = {k: v for k, v in native.items() if k not in dropped}
    return {
        "architectures": [fmt.architecture],
        "speculators_model_type": fmt.speculators_type,
        "transformer_layer_config": layer,
        **fmt.fields,
        "speculators_config": {
            "algorithm": fmt.speculators_type,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": drafter.num_speculative_tokens,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": [target.architecture]},
        },
        "dtype": native["dtype"],
    }


def is_export(path: Path) -> bool:
    """True for a directory ``export-draft`` wrote: its provenance file names how to serve it
    and the versions that wrote it."""
    try:
        info = json.loads((Path(path) / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and "serving" in info and "versions" in info


def check_replaceable_export(out: Path, overwrite: bool) -> None:
    """``out`` may be replaced: new, empty, or an earlier export holding nothing but the
    files it recorded writing (``ownership``); a file the user added to an export, or a card
    they edited, makes ``--overwrite`` refuse, naming it."""
    check_owned(out, "OUT_DIR", overwrite, COMMAND, "an export", legacy=legacy_export_files)


def legacy_export_files(out: Path) -> set[str] | None:
    """What an export from before the ownership record wrote: the ``files`` its provenance
    lists (or the four every export wrote); None when ``out`` is not an export."""
    if not is_export(out):
        return None
    listed = json.loads((out / PROVENANCE_FILE).read_text()).get("files", EXPORT_FILES)
    if not isinstance(listed, list):
        raise UnsafePathError(f"{out / PROVENANCE_FILE}: 'files' must be a list of file names")
    for name in listed:
        confined(out, name, out / PROVENANCE_FILE)
    return set(listed)


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
    with owned_directory(out, COMMAND, "an export", legacy_export_files) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        # the card names the final directory, where the drafter will be served from
        (tmp / CARD_FILE).write_text(render_card(provenance, out.resolve()))
