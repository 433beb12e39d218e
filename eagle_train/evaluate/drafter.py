"""Read a drafter directory before any engine starts, in any layout vLLM serves: its method,
K, whether its tensors match vLLM's contract for this target (vLLM itself would not say), and
whether the target it names is this one. The drafter is an input: nothing here writes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.contract import contract_problems, default_aux_problems
from eagle_train.drafts.layouts import DrafterLayout, LayoutError, read_layout
from eagle_train.engine.vllm_engine import cuda_available
from eagle_train.errors import UserError
from eagle_train.target_model import TargetDescription


class DrafterError(UserError, ValueError):
    pass


NGRAM = "ngram"  # --draft ngram: vLLM's prompt-lookup proposer, a floor that needs no training
NGRAM_DEFAULTS = {"prompt_lookup_max": 4, "prompt_lookup_min": 1}


@dataclass(frozen=True)
class DrafterInfo:
    path: Path
    spec: DraftSpec | None  # None for the n-gram proposer
    method: str
    num_speculative_tokens: int
    # Further speculative_config keys the export records (e.g. a drafting mode switch).
    extra: dict[str, Any] = field(default_factory=dict)
    # Where the drafter comes from, as far as it says ("unknown" where it does not): its
    # layout, the tool that wrote it, the target it names and how that compares.
    source: dict[str, Any] = field(default_factory=dict)

    def speculative_config(self) -> dict[str, Any]:
        return {
            **self.extra,
            "method": self.method,
            "model": str(self.path),
            "num_speculative_tokens": self.num_speculative_tokens,
        }


def inspect_drafter(
    path: str | Path,
    target: TargetDescription,
    num_speculative_tokens: int | None = None,
    target_dir: str | Path | None = None,
    allow_other_target: bool = False,
) -> DrafterInfo:
    """The drafter at ``path`` read as vLLM reads it (any layout vLLM serves,
    ``drafts/layouts.py``), checked against vLLM's contract and against the target it names;
    DrafterError (one line) before any engine starts. ``allow_other_target`` measures a
    drafter whose named target differs from ``target`` (same vocabulary and sizes) anyway."""
    if str(path) == NGRAM:
        return DrafterInfo(
            path=Path(NGRAM),
            spec=None,
            method=NGRAM,
            num_speculative_tokens=num_speculative_tokens or 3,
            extra=dict(NGRAM_DEFAULTS),
        )
    path = Path(path)
    try:
        found = read_layout(path)
    except LayoutError as exc:
        raise DrafterError(str(exc)) from None
    if found.spec.gpu_only and not cuda_available():
        raise DrafterError(f"{path}: {found.spec.gpu_only}")
    problems = contract_problems(found.spec, found.native, found.tensors, target)
    problems += default_aux_problems(found.native, target)
    if problems:
        raise DrafterError(f"{path}: not servable next to this target:\n  " + "\n  ".join(problems))
    mismatch = other_target(found, target, target_dir)
    if mismatch and not allow_other_target:
        raise DrafterError(
            f"{path}: {mismatch}; set allow_other_target=true to measure it next to this "
            "target anyway"
        )
    serving = found.serving
    k = (
        num_speculative_tokens
        or serving.get("num_speculative_tokens")
        or found.spec.served_tokens(found.native)
    )
    if not k:
        raise DrafterError(
            f"{path}: the drafter does not record how many tokens it drafts; "
            "pass --set num_speculative_tokens=K"
        )
    extra = {
        key: value
        for key, value in serving.items()
        if key not in ("method", "model", "num_speculative_tokens")
    }
    source = {
        "layout": found.layout,
        "made_by": found.made_by,
        "verifier": found.verifier.get("name_or_path") or "unknown",
        "target_check": f"overridden: {mismatch}" if mismatch else "matches",
        "skipped_tensors": found.skipped,
    }
    return DrafterInfo(
        path=path,
        spec=found.spec,
        method=str(serving["method"]),
        num_speculative_tokens=int(k),
        extra=extra,
        source=source,
    )


def other_target(
    found: DrafterLayout, target: TargetDescription, target_dir: str | Path | None
) -> str | None:
    """How the target the drafter names differs from ``target`` (None: no difference
    found, or the drafter names none): the architecture it records, the sizes its provenance
    records, and the config of a named verifier directory that exists here."""
    named = found.verifier.get("name_or_path") or "?"
    archs = found.verifier.get("architectures") or []
    if archs and target.architecture not in archs:
        return f"made for {named} ({', '.join(archs)}), the target is a {target.architecture}"
    recorded = (found.provenance or {}).get("target")
    if isinstance(recorded, dict):
        for key, ours in (
            ("architecture", target.architecture),
            ("num_layers", target.num_layers),
            ("hidden_size", target.hidden_size),
        ):
            if recorded.get(key) not in (None, ours):
                return f"made for {named} ({key} {recorded[key]}), the target has {key} {ours}"
    local = Path(str(named))
    if target_dir is not None and local.is_dir() and (local / "config.json").is_file():
        if local.resolve() != Path(target_dir).resolve() and _structure(local) != _structure(
            Path(target_dir)
        ):
            return f"made for {named}, whose config.json differs from the target's"
    return None


def _structure(model_dir: Path) -> dict[str, Any]:
    """A model's config.json less the keys that name a copy rather than a model (its path,
    storage dtype, the transformers version that wrote it)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    for key in ("_name_or_path", "dtype", "torch_dtype", "transformers_version"):
        config.pop(key, None)
    return config
