"""A drafter directory in any layout vLLM 0.32 serves, read as vLLM reads it (headers only).

Layouts: ``native`` (export-draft's vLLM format, z-lab's DFlash: config.json as vLLM reads
it), ``speculators`` (export-draft --format speculators, ``speculators train`` output and
published speculators drafters: EAGLE-3, P-EAGLE, DFlash; the native config is rebuilt as
vLLM's speculators loader does, ``transformers_utils/configs/speculators``) and ``safeailab``
(SafeAILab's EAGLE-1 and EAGLE-3 checkpoints: a Llama config, ``midlayer.*`` in EAGLE-3).

The tensors are named and shaped as vLLM's drafter ``load_weights`` sees them: ``t2d`` is
skipped (``llama_eagle3.py``, ``qwen3_dflash.py``), ``midlayer.`` is ``layers.0.`` and
``mask_hidden`` is viewed flat. The result feeds the same contract check as export-draft
(``contract.contract_problems``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.contract import PROVENANCE_FILE
from eagle_train.drafts.registry import DRAFTS, identify_drafter
from eagle_train.errors import UserError

Shapes = dict[str, tuple[tuple[int, ...], torch.dtype]]

# vLLM's renames on load (``hf_to_vllm_mapper`` of llama_eagle3.py and qwen3_dflash.py).
RENAMES = {
    "midlayer.": "layers.0.",
    "encoder.output_norm_enc.": "hidden_norm.",
    "encoder.fc.": "fc.",
}
# Tensors vLLM's loaders of these methods skip (the target-to-draft map: vLLM needs d2t only).
SKIPPED = {"eagle3": ("t2d",), "dflash": ("t2d",)}
# Tensors vLLM loads through a view of another shape (``mask_hidden.copy_(w.view(1, -1))``).
FLATTENED = ("mask_hidden",)

_DTYPES = {
    "I64": torch.int64,
    "I32": torch.int32,
    "BOOL": torch.bool,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
}


class LayoutError(UserError, ValueError):
    """A drafter directory vLLM would not read (one line, naming the file)."""


@dataclass(frozen=True)
class DrafterLayout:
    path: Path
    layout: str  # "native", "speculators" or "safeailab"
    spec: DraftSpec
    native: dict[str, Any]  # vLLM's native config, vLLM's defaults filled in
    # vLLM's speculative_config as the drafter states it (method, num_speculative_tokens
    # when it says, extras such as parallel_drafting)
    serving: dict[str, Any]
    tensors: Shapes  # as vLLM's loader sees them: renamed, skipped ones left out
    skipped: list[str]  # shipped tensors vLLM skips on load
    provenance: dict[str, Any] | None  # eagle_train.json, None when the drafter has none
    verifier: dict[str, Any] = field(default_factory=dict)  # the target the drafter names
    made_by: str = "unknown"


def read_layout(path: str | Path) -> DrafterLayout:
    """The drafter at ``path`` as vLLM reads it; LayoutError (one line) where it cannot."""
    path = Path(path)
    raw = read_json(path / "config.json")
    provenance = read_json(path / PROVENANCE_FILE) if (path / PROVENANCE_FILE).is_file() else None
    verifier: dict[str, Any] = {}
    made_by = "unknown"
    if "speculators_config" in raw:
        layout = "speculators"
        serving = speculators_serving(raw, path)
        found = [c for s in DRAFTS.values() if (c := s.from_speculators(raw)) is not None]
        if not found:
            raise LayoutError(
                f"{path / 'config.json'}: speculators type "
                f"{raw.get('speculators_model_type')!r} is not one this version serves"
            )
        config = found[0]
        verifier = dict(raw["speculators_config"].get("verifier") or {})
        if raw.get("speculators_version"):
            made_by = f"speculators {raw['speculators_version']}"
    else:
        layout, config = "native", raw
        serving = dict((provenance or {}).get("serving") or {})
    if provenance is not None:
        versions = provenance.get("versions") or {}
        made_by = f"eagle-train {versions.get('eagle_train', '?')}"
        if versions.get("git_revision"):
            made_by += f" (git {versions['git_revision']})"
        if not verifier and isinstance(provenance.get("target"), dict):
            verifier = {"name_or_path": provenance["target"].get("name_or_path")}
    try:
        spec = identify_drafter(config, serving.get("method"))
    except ValueError as exc:
        raise LayoutError(f"{path}: {exc}") from None
    serving.setdefault("method", spec.vllm_method)
    shipped = tensor_shapes(path)
    if any(n.startswith("midlayer.") for n in shipped):
        layout = "safeailab"
    elif layout == "native" and provenance is None and config.get("bias") is not None:
        layout = "safeailab"  # SafeAILab's EAGLE-1 config records its fc bias
    tensors, skipped = as_vllm_loads(shipped, serving["method"])
    return DrafterLayout(
        path=path,
        layout=layout,
        spec=spec,
        native=with_vllm_defaults(config, spec),
        serving=serving,
        tensors=tensors,
        skipped=skipped,
        provenance=provenance,
        verifier=verifier,
        made_by=made_by,
    )


def speculators_serving(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """vLLM's speculative_config of a speculators-format config, as vLLM builds it
    (``SpeculatorsConfig.build_vllm_speculative_config``): the method from its type, K
    from the first proposal method; ``peagle`` is eagle3 with parallel drafting."""
    try:
        first = raw["speculators_config"]["proposal_methods"][0]
        k = first["speculative_tokens"]
        raw["speculators_config"]["verifier"]["name_or_path"]  # noqa: B018 (vLLM requires it)
        kind = raw["speculators_model_type"]
    except (KeyError, IndexError, TypeError):
        raise LayoutError(
            f"{path / 'config.json'}: not a speculators config vLLM reads (expected "
            "speculators_model_type and speculators_config.proposal_methods[0]."
            "speculative_tokens and .verifier.name_or_path)"
        ) from None
    if not isinstance(raw.get("transformer_layer_config"), dict):
        raise LayoutError(f"{path / 'config.json'}: expected a transformer_layer_config object")
    serving: dict[str, Any] = {"method": kind, "num_speculative_tokens": k}
    if kind == "peagle":
        serving.update(method="eagle3", parallel_drafting=True)
    elif kind == "dflash2":
        serving["method"] = "dflash"
    return serving


def with_vllm_defaults(config: dict[str, Any], spec: DraftSpec) -> dict[str, Any]:
    """``config`` with the values vLLM's drafter assumes where it leaves them out."""
    out = dict(config)
    if "hidden_size" in out and "num_attention_heads" in out:
        out.setdefault("head_dim", out["hidden_size"] // out["num_attention_heads"])
        out.setdefault("target_hidden_size", out["hidden_size"])
    if out.get("target_hidden_size") is None and "hidden_size" in out:
        out["target_hidden_size"] = out["hidden_size"]
    if out.get("draft_vocab_size") is None:  # every vLLM drafter class defaults it so
        out["draft_vocab_size"] = out.get("vocab_size")
    if spec.uses_draft_vocab:
        ids = out.get("eagle_aux_hidden_state_layer_ids")
        out.setdefault("num_aux_hidden_states", len(ids) if ids else 3)
    return out


def as_vllm_loads(shipped: Shapes, method: str) -> tuple[Shapes, list[str]]:
    """(tensors under vLLM's names and views, the shipped names vLLM skips)."""
    skip = SKIPPED.get(method, ())
    out: Shapes = {}
    skipped = []
    for name, (shape, dtype) in shipped.items():
        if name in skip:
            skipped.append(name)
            continue
        for old, new in RENAMES.items():
            name = name.replace(old, new)
        if name in FLATTENED:
            shape = (int(torch.Size(shape).numel()),)
        out[name] = (shape, dtype)
    return out, skipped


def tensor_shapes(path: Path) -> Shapes:
    """Names, shapes and dtypes of every weight file vLLM would load from ``path``:
    ``*.safetensors`` (headers only), else ``pytorch_model*.bin`` (weights only, mapped)."""
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    out: Shapes = {}
    for file in files:
        try:
            out.update(_file_shapes(file))
        except (SafetensorError, OSError, RuntimeError, EOFError, ValueError) as exc:
            kind = "safetensors" if file.suffix == ".safetensors" else "torch weights"
            raise LayoutError(f"{file}: not a readable {kind} file ({exc})") from None
    if not out:
        raise LayoutError(f"{path}: no model.safetensors or pytorch_model.bin")
    return out


def _file_shapes(file: Path) -> Shapes:
    if file.suffix == ".safetensors":
        with safe_open(str(file), framework="pt") as f:
            return {
                name: (tuple(f.get_slice(name).get_shape()), _dtype(f.get_slice(name)))
                for name in f.keys()  # noqa: SIM118 (safe_open is not a mapping)
            }
    state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(state, dict):
        raise ValueError("expected a state dict of tensors")
    return {n: (tuple(t.shape), t.dtype) for n, t in state.items()}


def _dtype(tensor_slice: Any) -> torch.dtype:
    return _DTYPES.get(tensor_slice.get_dtype(), torch.float32)


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise LayoutError(f"{path.parent}: missing {path.name}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LayoutError(f"{path}: malformed JSON ({exc})") from None
    if not isinstance(data, dict):
        raise LayoutError(f"{path}: expected a JSON object")
    return data
