"""Read an exported drafter directory before any engine starts: its method, K, and whether
its tensors match vLLM's contract for this target (vLLM itself would not say)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.contract import PROVENANCE_FILE, contract_problems, native_config
from eagle_train.drafts.registry import identify_drafter
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

    def speculative_config(self) -> dict[str, Any]:
        return {
            **self.extra,
            "method": self.method,
            "model": str(self.path),
            "num_speculative_tokens": self.num_speculative_tokens,
        }


def inspect_drafter(
    path: str | Path, target: TargetDescription, num_speculative_tokens: int | None = None
) -> DrafterInfo:
    if str(path) == NGRAM:
        return DrafterInfo(
            path=Path(NGRAM),
            spec=None,
            method=NGRAM,
            num_speculative_tokens=num_speculative_tokens or 3,
            extra=dict(NGRAM_DEFAULTS),
        )
    path = Path(path)
    _read_json(path / "config.json")  # present and readable
    try:
        config = native_config(path)  # the native config, also of a speculators export
    except ValueError as exc:
        raise DrafterError(str(exc)) from None
    serving = (
        _read_json(path / PROVENANCE_FILE).get("serving", {})
        if (path / PROVENANCE_FILE).is_file()
        else {}
    )
    try:
        spec = identify_drafter(config, serving.get("method"))
    except ValueError as exc:
        raise DrafterError(f"{path}: {exc}") from None
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise DrafterError(f"{path}: no model.safetensors")
    problems = contract_problems(spec, config, _tensor_shapes(weights), target)
    if problems:
        raise DrafterError(f"{path}: not servable next to this target:\n  " + "\n  ".join(problems))
    k = num_speculative_tokens or serving.get("num_speculative_tokens")
    if not k:
        raise DrafterError(
            f"{path}: the export does not record how many tokens it drafts; "
            "pass --num-speculative-tokens"
        )
    extra = {
        key: value
        for key, value in serving.items()
        if key not in ("method", "model", "num_speculative_tokens")
    }
    return DrafterInfo(
        path=path, spec=spec, method=spec.vllm_method, num_speculative_tokens=k, extra=extra
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DrafterError(f"{path.parent}: missing {path.name}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DrafterError(f"{path}: malformed JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise DrafterError(f"{path}: expected a JSON object")
    return data


_DTYPES = {
    "I64": torch.int64,
    "I32": torch.int32,
    "BOOL": torch.bool,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
}


def _tensor_shapes(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Names, shapes and dtypes from the safetensors header (no tensor data is read)."""
    out = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                sl = f.get_slice(name)
                out[name] = (tuple(sl.get_shape()), _DTYPES.get(sl.get_dtype(), torch.float32))
    except (SafetensorError, OSError) as exc:  # e.g. a file cut short by an interrupted copy
        raise DrafterError(f"{path}: not a readable safetensors file ({exc})") from None
    return out
