"""Micro-batches from a prepared dataset: seeded shuffling, right padding, a resumable position.

Each epoch is a fresh permutation drawn from ``seed + epoch`` (a mixture of datasets draws its
rows by weight, data/mixture.py), cut into global micro-batches of ``batch_size`` rows, or,
with ``max_tokens`` (packing, data/packing.py), of whole rows of similar length up to that many
padded tokens;
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
from eagle_train.data.packing import BatchMeter, pack, row_stats
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

    @property
    def source_names(self) -> list[str]:
        return [self.path.name]

    def source_of(self, rows: Tensor) -> Tensor:
        """(B,) index of the source each dataset row comes from (one source: zeros)."""
        return torch.zeros(len(rows), dtype=torch.long)

    def epoch_order(self, gen: torch.Generator) -> list[int]:
        """One epoch's rows in training order (a permutation of all rows)."""
        return torch.randperm(len(self), generator=gen).tolist()


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
        max_tokens: int | None = None,
    ) -> None:
        # An epoch is a whole number of optimizer steps (world_size x grad_accum micro-batches
        # each), so no step straddles two epochs, and W ranks x A accumulation steps see the
        # same stream as one process with grad_accum = W x A, epoch after epoch.
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.pad_id, self.max_length, self.max_tokens = pad_id, max_length, max_tokens
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        self.per_step = world_size * grad_accum
        self.lengths = row_stats(data.rows, max_length)[0] if max_tokens is not None else None
        self.state = LoaderState()
        self.meter = BatchMeter(len(data.source_names))
        self._epoch: tuple[int, list[list[int]]] | None = None  # (epoch, its micro-batches)
        if self.batches_per_epoch < 1:
            what = f"of {batch_size}" if max_tokens is None else f"packed to {max_tokens} tokens"
            raise DataError(
                f"{data.path}: {len(data)} rows cannot fill one step of {self.per_step} "
                f"micro-batch(es) {what} ({world_size} rank(s) x grad_accum {grad_accum})",
                reason="config",
            )

    @property
    def batches_per_epoch(self) -> int:
        """Global micro-batches of the current epoch (a whole number of steps)."""
        return len(self._batches(self.state.epoch))

    def _batches(self, epoch: int) -> list[list[int]]:
        """The micro-batches (dataset rows) of ``epoch``, all ranks', computed once per epoch."""
        if self._epoch is None or self._epoch[0] != epoch:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            order = self.data.epoch_order(gen) if self.shuffle else list(range(len(self.data)))
            if self.lengths is None or self.max_tokens is None:
                size = self.batch_size
                batches = [order[i : i + size] for i in range(0, len(order) - size + 1, size)]
            else:
                batches = pack(order, self.lengths, self.max_tokens, gen)
            self._epoch = (epoch, batches[: len(batches) // self.per_step * self.per_step])
        return self._epoch[1]

    def next(self) -> Batch:
        if self.state.offset >= self.batches_per_epoch:
            self.state = LoaderState(epoch=self.state.epoch + 1, offset=0)
        batches = self._batches(self.state.epoch)
        if not batches:
            raise DataError(f"{self.data.path}: epoch {self.state.epoch} holds no whole step")
        indices = batches[self.state.offset + self.rank]
        self.state.offset += self.world_size
        batch = self.collate(indices)
        self.meter.add(batch.loss_mask, batch.lengths, self.data.source_of(batch.rows))
        return batch

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
