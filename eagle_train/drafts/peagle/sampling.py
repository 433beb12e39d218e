"""Which draft slots one P-EAGLE forward computes, and who attends whom.

An element is (anchor a, depth d): depth 0 reads the real (x_{a+1}, aux_a), depth d >= 1 the
mask token and mask_hidden at position a+d; it predicts x_{a+2+d}. Elements are kept in a
dense (B, T, K) bool grid and flattened per sequence in (anchor, depth) order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def supervision(loss_mask: Tensor, lengths: Tensor, depths: int) -> Tensor:
    """(B,T,K) bool: element (a, d) predicts a real assistant token x_{a+2+d}."""
    b, t = loss_mask.shape
    pos = (
        torch.arange(t, device=loss_mask.device)[:, None]
        + 2
        + torch.arange(depths, device=loss_mask.device)[None, :]
    )  # (T,K) target position
    inside = pos[None] < lengths[:, None, None]
    padded = torch.cat([loss_mask.bool(), loss_mask.new_zeros(b, depths + 2).bool()], dim=1)
    return inside & padded[:, pos]


def sample_elements(
    lengths: Tensor,
    t: int,
    depths: int,
    supervised: Tensor | None,
    keep: list[float] | None,
) -> Tensor:
    """(B,T,K) bool grid of the elements to compute.

    Depth 0: every anchor with a next token (a+1 < length). Of these, the N valid ones are
    those with a supervised element (``supervised`` None: all of them). Depth d keeps
    ``int((N - d) * keep[d])`` anchors, a fraction of the WHOLE valid set (the fractions do
    not compound), drawn at random from depth d-1's survivors that have a supervised element
    at depth >= d, and capped by that pool. ``keep`` None keeps every candidate (evaluation).
    """
    device = lengths.device
    anchors = torch.arange(t, device=device)
    grid = torch.zeros(len(lengths), t, depths, dtype=torch.bool, device=device)
    grid[:, :, 0] = anchors[None, :] + 1 < lengths[:, None]
    # later[b, a, d]: some depth >= d of anchor a is supervised
    later = None if supervised is None else supervised.flip(-1).cummax(-1).values.flip(-1)
    valid = grid[:, :, 0] if later is None else grid[:, :, 0] & later[:, :, 0]
    num_valid = valid.sum(1).tolist()
    for d in range(1, depths):
        candidates = grid[:, :, d - 1] if later is None else grid[:, :, d - 1] & later[:, :, d]
        if keep is None:
            grid[:, :, d] = candidates
            continue
        for b in range(len(lengths)):
            idx = candidates[b].nonzero().squeeze(1)
            n = min(len(idx), int(max(num_valid[b] - d, 0) * keep[d]))
            grid[b, idx[torch.randperm(len(idx), device=device)[:n]], d] = True
    return grid


def keep_fractions(depths: int, ratio: float, minimum: float) -> list[float]:
    """Fraction of the whole valid set kept at each depth: 1, then max(r^d, r_min)."""
    return [1.0] + [max(ratio**d, minimum) for d in range(1, depths)]


@dataclass
class Elements:
    """Selected elements, flattened per sequence and right-padded to M columns."""

    anchor: Tensor  # (B,M) long
    depth: Tensor  # (B,M) long
    valid: Tensor  # (B,M) bool: a real element (not padding)

    @classmethod
    def from_grid(cls, grid: Tensor) -> Elements:
        b, t, k = grid.shape
        flat = grid.reshape(b, t * k)
        counts = flat.sum(1)
        m = max(int(counts.max()) if b else 0, 1)  # one (padding) column at least
        # stable: selected first, each row keeping (anchor, depth) order
        order = torch.argsort((~flat).to(torch.int8), dim=1, stable=True)[:, :m]
        valid = torch.arange(m, device=grid.device)[None, :] < counts[:, None]
        return cls(anchor=order // k, depth=order % k, valid=valid)

    def rows(self) -> Tensor:
        """(B,1) the batch row of each element, for indexing a (B,T,K) grid."""
        return torch.arange(len(self.anchor), device=self.anchor.device)[:, None]

    def pick(self, grid: Tensor) -> Tensor:
        """(B,M) bool: which elements are set in a (B,T,K) grid."""
        return (
            grid[torch.arange(len(grid), device=grid.device)[:, None], self.anchor, self.depth]
            & self.valid
        )


def attention_mask(e: Elements) -> Tensor:
    """(B,1,M,M) bool, True where query i may attend key j (same sequence by construction):
    j is depth 0 with an anchor <= i's, or j is i's own anchor at a depth <= i's. Padding
    queries see themselves only (a row with no key would give NaN)."""
    aq, ak = e.anchor[:, :, None], e.anchor[:, None, :]
    dq, dk = e.depth[:, :, None], e.depth[:, None, :]
    rule = ((dk == 0) & (aq >= ak)) | ((aq == ak) & (dq >= dk))
    rule = rule & e.valid[:, None, :] & e.valid[:, :, None]
    eye = torch.eye(e.anchor.shape[1], dtype=torch.bool, device=e.anchor.device)
    return (rule | eye[None])[:, None]


def block_mask(e: Elements):  # -> torch.nn.attention.flex_attention.BlockMask
    """``attention_mask(e)`` as a flex-attention block mask (the same rule, per element)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, qi, ki):
        aq, ak = e.anchor[b, qi], e.anchor[b, ki]
        dq, dk = e.depth[b, qi], e.depth[b, ki]
        rule = ((dk == 0) & (aq >= ak)) | ((aq == ak) & (dq >= dk))
        return (rule & e.valid[b, ki] & e.valid[b, qi]) | (qi == ki)

    m = e.anchor.shape[1]
    return create_block_mask(mask_mod, e.anchor.shape[0], None, m, m, device=e.anchor.device)


def segment_grids(grid: Tensor, num_segments: int) -> list[tuple[Tensor, Tensor]]:
    """Split by anchor into ``num_segments`` contiguous ranges: per range (the elements to
    forward, the elements it supervises). A range forwards its own elements plus the depth-0
    elements of every earlier anchor, the context its elements attend (through every layer),
    so its loss sees exactly the computation it sees in one pass."""
    t = grid.shape[1]
    bounds = [round(i * t / num_segments) for i in range(num_segments + 1)]
    anchors = torch.arange(t, device=grid.device)[None, :, None]
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        own = grid & (anchors >= lo) & (anchors < hi)
        context = grid & (anchors < lo)
        context[:, :, 1:] = False
        parts.append((own | context, own))
    return parts
