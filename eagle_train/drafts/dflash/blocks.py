"""DFlash training blocks: which target layers, which anchors, how slots are weighted.

A block anchored at position ``a`` is ``[x_a, MASK, ..., MASK]`` at positions a..a+B-1;
slot k (1..B-1) predicts x_{a+k} from the target's context strictly before a.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from eagle_train.drafts.common import DecoderDims, layer_shape
from eagle_train.drafts.dflash.config import DFlashConfig
from eagle_train.memory_plan import DraftActivations
from eagle_train.target_model import TargetDescription

# Published position-weight decay per block size (docs/algorithms/dflash.md).
_GAMMA_POINTS = ((8, 4.0), (10, 5.0), (16, 7.0))


def default_layer_ids(num_layers: int, num_features: int) -> list[int]:
    """0-based target layer outputs: ``round(1 + i*(L-4)/(n-1))``; n=1 -> [L//2]."""
    if num_features == 1:
        return [num_layers // 2]
    return [round(1 + i * (num_layers - 4) / (num_features - 1)) for i in range(num_features)]


def select_layer_ids(explicit: list[int] | None, num_features: int, num_layers: int) -> list[int]:
    """The configured or default ids, checked distinct and inside the target (sorted: vLLM
    concatenates the target's hidden states in layer order)."""
    ids = list(explicit) if explicit is not None else default_layer_ids(num_layers, num_features)
    if not ids or len(set(ids)) != len(ids) or any(not 0 <= i < num_layers for i in ids):
        source = (
            "draft.target_layer_ids"
            if explicit is not None
            else (f"the default for draft.num_target_features={num_features}")
        )
        raise ValueError(
            f"{source} gives target layer ids {ids}: they must be distinct 0-based layer "
            f"outputs in 0..{num_layers - 1} (the target has {num_layers} layers); set "
            f"draft.target_layer_ids explicitly, e.g. {list(range(min(num_features, num_layers)))}"
        )
    return sorted(ids)


def loss_gamma(block_size: int, override: float | None = None) -> float:
    """Decay of the slot weights: the published value for B in {8, 10, 16}, piecewise-linear
    between them and extended by the nearest segment outside (at least 1)."""
    if override is not None:
        return override
    pts = _GAMMA_POINTS
    seg = 0 if block_size <= pts[1][0] else 1
    (b0, g0), (b1, g1) = pts[seg], pts[seg + 1]
    return max(1.0, g0 + (block_size - b0) * (g1 - g0) / (b1 - b0))


def slot_weights(block_size: int, gamma: float) -> Tensor:
    """(B-1,) weights of slots k=1..B-1: exp(-(k-1)/gamma)."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def valid_anchors(loss_mask: Tensor, lengths: Tensor, block_size: int) -> Tensor:
    """(Bt, T) bool: ``a`` can anchor a block iff a >= 1 (serving always has context),
    a+B-1 < length, and its first drafted token x_{a+1} is supervised (loss_mask 1).

    The rest of the block need not be: each slot is weighted by its own mask
    (``slot_mask``), so a turn's last B-1 tokens and turns shorter than B train too."""
    batch, length = loss_mask.shape
    span = block_size - 1
    pos = torch.arange(length, device=loss_mask.device)
    first = torch.nn.functional.pad(loss_mask[:, 1:].bool(), (0, 1))  # loss_mask[a+1]
    inside = (pos[None, :] + span) < lengths[:, None]
    return first & inside & (pos[None, :] >= 1)


def slot_mask(loss_mask: Tensor, anchors: Tensor, valid: Tensor, block_size: int) -> Tensor:
    """(Bt, N, B-1) bool: slot k of the block at ``anchors[b, n]`` is supervised iff the
    block is real and x_{a+k} is an assistant token (loss_mask[a+k] = 1)."""
    length = loss_mask.shape[1]
    k = torch.arange(1, block_size, device=anchors.device)
    pos = anchors[..., None] + k  # (Bt, N, B-1)
    inside = pos < length
    labels = loss_mask.bool().gather(1, pos.clamp(max=length - 1).flatten(1)).view(pos.shape)
    return labels & inside & valid[..., None]


@dataclass
class Anchors:
    positions: Tensor  # (Bt, N) anchor positions, ascending per row; padding blocks at 0
    valid: Tensor  # (Bt, N) bool: a real block (padding blocks carry no loss)


def sample_anchors(
    loss_mask: Tensor,
    lengths: Tensor,
    block_size: int,
    max_anchors: int,
    generator: torch.Generator | None = None,
) -> Anchors:
    """Up to ``max_anchors`` distinct valid anchors per sequence, uniformly at random (the
    torch RNG, or ``generator``), sorted by position. N = the most any row got (>= 1)."""
    ok = valid_anchors(loss_mask, lengths, block_size)
    batch, length = ok.shape
    keys = torch.rand(batch, length, device=ok.device, generator=generator)
    keys = torch.where(ok, keys, torch.full_like(keys, -1.0))
    top = keys.topk(min(max_anchors, length), dim=1)
    chosen = top.values >= 0
    n = max(1, int(chosen.sum(1).max()))
    positions = torch.where(chosen[:, :n], top.indices[:, :n], torch.zeros_like(top.indices[:, :n]))
    # Sort by position with padding (position 0, never valid) first, then move it last.
    order = torch.where(chosen[:, :n], positions, positions + length + 1).argsort(1)
    return Anchors(positions=positions.gather(1, order), valid=chosen[:, :n].gather(1, order))


def block_positions(anchors: Tensor, block_size: int) -> Tensor:
    """(Bt, N, B) positions a+k of every block slot."""
    return anchors[..., None] + torch.arange(block_size, device=anchors.device)


def block_activations(
    cfg: DFlashConfig, target: TargetDescription, tokens: int, rows: int, num_features: int
) -> DraftActivations:
    """Up to ``num_anchors`` blocks per row (at most one per token), every slot of a block
    through every layer; per context token fc's input and each layer's keys and values."""
    dims = DecoderDims.from_target(target)
    context_kv = 2 * dims.num_kv_heads * dims.head_dim
    return DraftActivations(
        units=min(rows * cfg.num_anchors, tokens) * cfg.block_size,
        layer=layer_shape(dims, qk_norm=True),
        num_layers=cfg.num_layers,
        first_input=dims.hidden_size,
        first_norms=1,
        per_token=(num_features + 1) * dims.hidden_size + cfg.num_layers * context_kv,
        what=f"draft.block_size={cfg.block_size}, draft.num_anchors={cfg.num_anchors}",
    )
