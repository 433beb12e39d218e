"""The frozen target sharded over the ranks with FSDP2, for targets larger than one device.

Every decoder layer is its own FSDP2 unit (gathered for its forward, freed right after), the
decoder is the root unit (final norm); the embeddings and the output head stay plain
replicated matrices (drafts copy them at build). No gradients, no optimizer state: a rank holds 1/W of the decoder's weights plus one
layer gathered at a time. Weights are read straight into each rank's shard from the
safetensors files (``torch.distributed.checkpoint``'s Hugging Face reader): no rank ever
holds the whole model.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from eagle_train.target_model.frozen import FrozenTarget
from eagle_train.target_model.weights import empty_model, load_head


def load_sharded_target(
    path: str | Path, dtype: torch.dtype, device: torch.device, world_size: int
) -> FrozenTarget:
    """A FrozenTarget whose decoder layers are FSDP2-sharded over ``world_size`` ranks
    (call on every rank of the initialised process group; features() is then a collective:
    every rank calls it the same number of times)."""
    model = empty_model(path, dtype)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    decoder = model.get_decoder()
    mesh = init_device_mesh(device.type, (world_size,))
    for layer in decoder.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    # The embeddings stay whole on every rank: drafts copy them when they are built.
    embed = {model.get_input_embeddings().weight}
    fully_shard(decoder, mesh=mesh, reshard_after_forward=True, ignored_params=embed)
    model.to_empty(device=device)
    for name, value in buffers.items():
        model.get_buffer(name).copy_(value)
    head = model.get_output_embeddings()
    state = {k: v for k, v in model.state_dict().items() if not _is(model, k, head)}
    dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(str(path)))
    load_head(model, path, device, embed=False)  # a replicated head (a copy if tied)
    return FrozenTarget(model)


def _is(model: torch.nn.Module, key: str, module: torch.nn.Module) -> bool:
    owner = model.get_submodule(key.rsplit(".", 1)[0]) if "." in key else model
    return owner is module
