"""Micro-batches from a prepared dataset: seeded shuffling, right padding, a resumable position.

Each epoch is a fresh permutation drawn from ``seed + epoch``, cut into global micro-batches;
rank r takes micro-batches r, r + W, r + 2W, ... So every rank sees a disjoint shard, and W
ranks at one micro-step see exactly the micro-batches that one process with
``grad_accum = W`` sees in one step (epochs hold whole steps, so this holds across epochs). The position (epoch, global micro-batches consumed)
is all a checkpoint needs to continue the same stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from eagle_train.data.errors import DataError
from eagle_train.data.store import PreparedDataError, load_prepared, read_meta
from eagle_train.data.vocab import COUNTS_FILE, VOCAB_FILE, load_token_counts, load_vocab_mapping


@dataclass
class Batch:
    """One micro-batch as the loop hands it to a draft."""

    input_ids: Tensor  # (B, T) right-padded token ids
    loss_mask: Tensor  # (B, T) 1 on assistant tokens
    attention_mask: Tensor  # (B, T) 1 on real tokens
    lengths: Tensor  # (B,) real lengths
    rows: Tensor | None = None  # (B,) dataset row indices (a feature cache reads by row)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


class PreparedData:
    """A prepared dataset directory: rows, meta and the supervised-token counts."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows = load_prepared(self.path)
        self.meta = read_meta(self.path)
        self.token_counts = _token_counts(self.path)

    def __len__(self) -> int:
        return len(self.rows)


def _token_counts(path: Path) -> Tensor | None:
    """The int64 [V] supervised-token counts prepare-data wrote; from an older dataset, the
    counts its draft vocabulary was built from; None when it has neither."""
    for name, load in ((COUNTS_FILE, load_token_counts), (VOCAB_FILE, load_vocab_mapping)):
        file = path / name
        if not file.is_file():
            continue
        try:
            found = load(file)
        except Exception as exc:  # safetensors' error for a cut or corrupt file
            raise PreparedDataError(f"{file}: unreadable ({exc})") from None
        return found if isinstance(found, Tensor) else found.counts
    return None


@dataclass
class LoaderState:
    epoch: int = 0
    offset: int = 0  # global micro-batches already taken in this epoch (all ranks)


class BatchLoader:
    def __init__(
        self,
        data: PreparedData,
        batch_size: int,
        seed: int,
        pad_id: int,
        max_length: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        grad_accum: int = 1,
    ) -> None:
        # An epoch is a whole number of optimizer steps (world_size x grad_accum micro-batches
        # each), so no step straddles two epochs, and W ranks x A accumulation steps see the
        # same stream as one process with grad_accum = W x A, epoch after epoch.
        per_step = world_size * grad_accum
        steps = len(data) // batch_size // per_step
        if steps < 1:
            raise DataError(
                f"{data.path}: {len(data)} rows cannot fill one step of {per_step} micro-batch(es) "
                f"of {batch_size} ({world_size} rank(s) x grad_accum {grad_accum})",
                reason="config",
            )
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.pad_id, self.max_length = pad_id, max_length
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        self.batches_per_epoch = steps * per_step  # global micro-batches
        self.state = LoaderState()
        self._epoch_order: tuple[int, list[int]] | None = None  # (epoch, this rank's order)

    def _order(self, epoch: int) -> list[int]:
        """The row order of ``epoch``, computed once per epoch."""
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            n = len(self.data)
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(n, generator=gen).tolist()
            else:
                order = list(range(n))
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]

    def next(self) -> Batch:
        if self.state.offset >= self.batches_per_epoch:
            self.state = LoaderState(epoch=self.state.epoch + 1, offset=0)
        order = self._order(self.state.epoch)
        start = (self.state.offset + self.rank) * self.batch_size
        self.state.offset += self.world_size
        return self.collate(order[start : start + self.batch_size])

    def collate(self, indices: list[int]) -> Batch:
        rows = self.data.rows[indices]
        seqs = [ids[: self.max_length] if self.max_length else ids for ids in rows["input_ids"]]
        masks = [m[: len(s)] for m, s in zip(rows["loss_mask"], seqs, strict=True)]
        length = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), length), self.pad_id, dtype=torch.long)
        loss_mask = torch.zeros((len(seqs), length), dtype=torch.long)
        attention = torch.zeros((len(seqs), length), dtype=torch.long)
        for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
            input_ids[i, : len(s)] = torch.tensor(s)
            loss_mask[i, : len(m)] = torch.tensor(m)
            attention[i, : len(s)] = 1
        lengths = attention.sum(1)
        return Batch(
            input_ids=input_ids,
            loss_mask=loss_mask,
            attention_mask=attention,
            lengths=lengths,
            rows=torch.tensor(indices, dtype=torch.long),
        )

    def epoch_batches(self) -> list[Batch]:
        """All micro-batches of one pass in file order, all ranks' (validation)."""
        n = len(self.data) - len(self.data) % self.batch_size
        return [
            self.collate(list(range(i, i + self.batch_size))) for i in range(0, n, self.batch_size)
        ]
