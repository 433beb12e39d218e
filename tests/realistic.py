"""Values shaped like real use, the defaults a test reaches for, so that a shape cannot hide a
bug: a wrong line that happens to agree on 1.0, on a multiple of the block size, on two lists
of the same length or on ids that fit 16 bits gets data on which it does not agree.

- ids: the wide world's vocabulary (``wide_world`` in tests/conftest.py: ``reserved_ids``) is
  33,024 ids and its common tokens sit above 32,767, as a real target's do; ``HIGH_ID`` is the
  first id a 16-bit integer cannot hold.
- lengths: none a multiple of 2, 4, 8, 16 or 32 (a block, a page, a granule), none dividing
  another.
- weights: none 1.0, none a multiple of another, not summing to the source count.
- counts: pairwise coprime, so no count divides another and no two agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

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


def vocab_size(target: Path | str) -> int:
    """The vocabulary size a target directory's config.json records (33,024 for the wide
    world's targets): what a test sizes a vocabulary by, never a number of its own."""
    return int(json.loads((Path(target) / "config.json").read_text())["vocab_size"])


def produced_ids(tokenizer_dir: Path | str) -> torch.Tensor:
    """The ids the tokenizer in ``tokenizer_dir`` (its tokenizer.json) can produce, sorted:
    every id but its reserved pieces (``<|reserved_K|>``, eagle_train/demo/tokenizer.py),
    which no text and no trained target ever yields."""
    spec = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    ids = [i for piece, i in spec["model"]["vocab"].items() if not piece.startswith("<|reserved_")]
    ids += [t["id"] for t in spec.get("added_tokens", [])]
    return torch.tensor(sorted(set(ids)))


def vocab_ids(tokenizer_dir: Path | str, n: int, seed: int) -> torch.Tensor:
    """``n`` sorted ids drawn (seeded) from those the tokenizer produces, as a draft
    vocabulary or a prompt would hold them; on the wide world, ids on both sides of 32,767."""
    produced = produced_ids(tokenizer_dir)
    pick = torch.randperm(len(produced), generator=torch.Generator().manual_seed(seed))[:n]
    ids = torch.sort(produced[pick]).values
    assert_shapes_like_real_use(ids, f"{n} ids of {tokenizer_dir}")
    return ids


def random_ids(
    tokenizer_dir: Path | str,
    shape: tuple[int, ...],
    skip: int = 0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Token ids of ``shape`` drawn uniformly from those the tokenizer produces, past its
    first ``skip`` (its special tokens come first): the ids a random prompt would hold. On
    the wide world about half sit above 32,767; a draw from ``range(vocab_size)`` would be
    almost all reserved ids, which no text holds and no target was trained on."""
    produced = produced_ids(tokenizer_dir)[skip:]
    return produced[torch.randint(len(produced), shape, generator=generator)]
