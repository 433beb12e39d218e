"""A drafter directory as vLLM reads it: the exporter's provenance file (how to serve it) and
the check of its config and tensors against vLLM's contract for a target. Shared by the
exporter (before writing), the warm start and the evaluation (before an engine starts; any
layout, read by ``layouts.py``)."""

from __future__ import annotations

from typing import Any

import torch

from eagle_train.drafts.base import DraftSpec
from eagle_train.target_model import TargetDescription

PROVENANCE_FILE = "eagle_train.json"


def contract_problems(
    spec: DraftSpec,
    config: dict[str, Any],
    tensors: dict[str, tuple[tuple[int, ...], torch.dtype]],
    target: TargetDescription,
) -> list[str]:
    """Every way ``config`` + tensors (name -> (shape, dtype)) break vLLM's contract for the
    given target: missing/unexpected/mis-shaped tensors, vocab or hidden size mismatches."""
    if config.get("vocab_size") != target.vocab_size:
        return [
            f"config vocab_size {config.get('vocab_size')} != the target's vocab size "
            f"{target.vocab_size}: the drafter was made for another target"
        ]
    if config.get("target_hidden_size", target.hidden_size) != target.hidden_size:
        return [
            f"config target_hidden_size {config['target_hidden_size']} != the target's "
            f"hidden size {target.hidden_size}: the drafter was made for another target"
        ]
    if not config.get("architectures"):
        return ["config has no architectures"]
    try:
        required, optional = spec.expected_tensors(config)
    except KeyError as exc:
        return [f"config.json lacks the key {exc.args[0]!r}"]
    problems = [f"missing tensor {n} {list(s)}" for n, s in required.items() if n not in tensors]
    for name, (shape, dtype) in tensors.items():
        expected = required.get(name, optional.get(name))
        if expected is None:
            problems.append(f"unexpected tensor {name} (vLLM would reject or ignore it)")
        elif tuple(shape) != tuple(expected):
            problems.append(f"tensor {name} has shape {list(shape)}, expected {list(expected)}")
        elif name == "d2t" and dtype != torch.int64:
            problems.append("d2t must be int64 offsets")
    return problems


def default_aux_problems(native: dict[str, Any], target: TargetDescription) -> list[str]:
    """A fused-layer drafter that names no aux layers (SafeAILab's EAGLE-3) is fed the
    target's default layers (2, L//2, L-3), each captured once (``gpu_model_runner``), while
    its fc reads ``num_aux_hidden_states`` of them (3 unless set): on a target of under 8
    layers the two differ and vLLM fails at the first request."""
    if "num_aux_hidden_states" not in native or native.get("eagle_aux_hidden_state_layer_ids"):
        return []
    if isinstance(native.get("dflash_config"), dict):
        return []  # DFlash names its layers in dflash_config
    ids = target.default_aux_layer_ids
    captured = len(set(ids))
    if captured == native["num_aux_hidden_states"]:
        return []
    return [
        f"config names no eagle_aux_hidden_state_layer_ids: vLLM then captures this target's "
        f"default layers {list(ids)}, {captured} distinct, but the drafter's fc reads "
        f"{native['num_aux_hidden_states']} (add eagle_aux_hidden_state_layer_ids to its "
        "config.json)"
    ]
