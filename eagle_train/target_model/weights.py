"""Parts of a target read straight from its safetensors files, and its identity.

Training from a feature cache needs only the target's embeddings and output head: the model
is built on the meta device (no memory) and just those two are loaded, so a 70B target costs
its two vocabulary matrices, not its 140 GB.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from accelerate import init_empty_weights  # type: ignore[import-untyped]
from safetensors import safe_open
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from eagle_train.target_model.description import TargetError
from eagle_train.target_model.frozen import FrozenTarget
from eagle_train.target_model.location import check_weights

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (sharded or single-file checkpoints)."""
    path = Path(path)
    if (path / INDEX).is_file():
        index = json.loads((path / INDEX).read_text())["weight_map"]
        return {name: path / file for name, file in index.items()}
    if (path / SINGLE).is_file():
        with safe_open(path / SINGLE, framework="pt") as f:
            return {name: path / SINGLE for name in f.keys()}  # noqa: SIM118
    raise TargetError(f"{path}: no {SINGLE} or {INDEX} (a safetensors checkpoint)")


def read_tensors(path: Path, names: list[str]) -> dict[str, Tensor]:
    files = weight_files(path)
    missing = [n for n in names if n not in files]
    if missing:
        raise KeyError(f"{path}: tensors {missing} are not in the checkpoint")
    out = {}
    for name in names:
        with safe_open(files[name], framework="pt") as f:
            out[name] = f.get_tensor(name)
    return out


def empty_model(path: str | Path, dtype: torch.dtype) -> PreTrainedModel:
    """The target's architecture with parameters on the meta device (buffers real, e.g.
    RoPE frequencies) and the output head untied from the embeddings, so each can be placed
    on its own."""
    config = AutoConfig.from_pretrained(path)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    head = model.get_output_embeddings()
    head.weight = nn.Parameter(torch.empty_like(head.weight, device="meta"), requires_grad=False)
    model.name_or_path = str(path)
    return model


def _param_name(model: nn.Module, module: nn.Module) -> str:
    for name, sub in model.named_modules():
        if sub is module:
            return f"{name}.weight"
    raise AssertionError("module is not part of the model")


def load_head(
    model: PreTrainedModel, path: str | Path, device: torch.device, embed: bool = True
) -> None:
    """Materialise the output head (and, with ``embed``, the input embeddings) of ``model``
    (built by ``empty_model``) from the checkpoint; a tied head reads the embedding matrix."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    embed_name, head_name = _param_name(model, embedding), _param_name(model, head)
    source = head_name if head_name in weight_files(Path(path)) else embed_name
    wanted = {source, embed_name} if embed else {source}
    tensors = read_tensors(Path(path), sorted(wanted))
    dtype = head.weight.dtype
    places = [(head, source)] + ([(embedding, embed_name)] if embed else [])
    for module, name in places:
        value = tensors[name].to(device=device, dtype=dtype)
        module.weight = nn.Parameter(value, requires_grad=False)
    if embed and source == embed_name:
        head.weight = embedding.weight  # tied, as in the whole model


def load_target_head(path: str | Path, dtype: torch.dtype, device: torch.device) -> FrozenTarget:
    """A FrozenTarget whose embeddings and head are loaded and whose decoder stays on the
    meta device: what a draft is built from when its features come from a cache."""
    check_weights(path, "target.path")
    model = empty_model(path, dtype)
    load_head(model, path, device)
    return FrozenTarget(model)


def target_identity(path: str | Path) -> dict[str, str]:
    """What names a target without reading its weights: the sha256 of its config.json and a
    fingerprint of its weight files (names and sizes). Moving the directory keeps it."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    config.pop("_name_or_path", None)
    canonical = json.dumps(config, sort_keys=True).encode()
    files = sorted(
        (p.name, p.stat().st_size) for p in path.iterdir() if p.suffix in (".safetensors", ".bin")
    )
    return {
        "path": str(path.resolve()),
        "config_sha256": hashlib.sha256(canonical).hexdigest(),
        "weights_fingerprint": hashlib.sha256(json.dumps(files).encode()).hexdigest(),
    }
