"""Values shaped like real use, the defaults a test reaches for, so that a shape cannot hide a
bug: a wrong line that happens to agree on 1.0, on a multiple of the block size, on two lists
of the same length or on ids that fit 16 bits gets data on which it does not agree.

- ids: the tiny world's vocabulary is 33,024 ids and its common tokens sit above 32,767
  (``configs/demo/tiny.yaml``: ``reserved_ids``), as a real target's do; ``HIGH_ID`` is the
  first id a 16-bit integer cannot hold.
- lengths: none a multiple of 2, 4, 8, 16 or 32 (a block, a page, a granule), none dividing
  another.
- weights: none 1.0, none a multiple of another, not summing to the source count.
- counts: pairwise coprime, so no count divides another and no two agree.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

HIGH_ID = 32_768  # int16's first unrepresentable value: real vocabularies go far above it

# Lengths of prompts, rows, requests: odd, so no power-of-two block divides them, and prime,
# so none divides another.
LENGTHS = (37, 53, 83, 101, 131, 157, 181, 211)
# Weights of sources, losses, probes: not 1, not multiples of each other, summing to
# neither 1 nor their count (1.0 + 2.5 + 0.35 = 3.85).
WEIGHTS = (2.5, 0.35, 1.7, 0.6)
# Counts of sources, stems, prompts, turns, probes: pairwise coprime.
COUNTS = (3, 5, 7, 11, 13)


def lengths(n: int) -> list[int]:
    """``n`` lengths, none a multiple of a power-of-two block, none dividing another."""
    return list(LENGTHS[:n])


def weights(n: int) -> list[float]:
    """``n`` weights, none 1.0 (``n`` <= 4)."""
    return list(WEIGHTS[:n])


def counts(n: int) -> list[int]:
    """``n`` pairwise coprime counts (3, 5, 7, ...)."""
    return list(COUNTS[:n])


def not_a_multiple(value: int, *blocks: int) -> bool:
    """``value`` is a multiple of none of ``blocks``: a rounding to them changes it."""
    return all(value % block for block in blocks)


def high_ids(ids: torch.Tensor | Iterable[int]) -> int:
    """How many of ``ids`` a 16-bit integer would wrap (id >= 32,768)."""
    tensor = torch.as_tensor(list(ids) if not isinstance(ids, torch.Tensor) else ids)
    return int((tensor >= HIGH_ID).sum())


def assert_shapes_like_real_use(ids: torch.Tensor | Iterable[int], what: str) -> None:
    """``ids`` hold ids above 32,767 and below it: the fixture could show an id wrap."""
    tensor = torch.as_tensor(list(ids) if not isinstance(ids, torch.Tensor) else ids)
    above = high_ids(tensor)
    assert 0 < above < tensor.numel(), (
        f"{what}: {above} of {tensor.numel()} ids above 32,767 (a fixture needs both kinds)"
    )
