"""Draft vocabulary: the Vd most frequent assistant tokens and the draft<->target id maps.

Counting is separate from building the map: prepare-data writes the supervised-token counts
over the whole target vocabulary (``token_counts.safetensors``), and the trainer builds the
mapping of the draft's configured size from them (or all-reduces the per-rank counts of a
dataset that has none, then calls ``build_vocab_mapping`` on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

VOCAB_FILE = "vocab.safetensors"  # the mapping's file name in a checkpoint (and older datasets)
COUNTS_FILE = "token_counts.safetensors"  # a prepared dataset's supervised-token counts


@dataclass(frozen=True)
class VocabMapping:
    """``target_id = draft_id + d2t[draft_id]``; ``t2d[target_id]`` is True for draft tokens."""

    d2t: torch.Tensor  # int64 [Vd]
    t2d: torch.Tensor  # bool [V]
    counts: torch.Tensor  # int64 [V], the counts the map was built from

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target ids of the draft vocabulary, ascending (``[Vd]``)."""
        return self.d2t + torch.arange(len(self.d2t))


class TokenCounter:
    """Counts token ids under the loss mask into an int64 ``[vocab_size]`` tensor."""

    def __init__(self, vocab_size: int, flush_every: int = 1 << 20) -> None:
        self.counts = torch.zeros(vocab_size, dtype=torch.int64)
        self._pending: list[int] = []
        self._flush_every = flush_every

    def add(self, input_ids: list[int], loss_mask: list[int]) -> None:
        self._pending.extend(t for t, m in zip(input_ids, loss_mask, strict=True) if m)
        # One bincount per ~1M tokens: a [V] bincount per conversation would dominate the time.
        if len(self._pending) >= self._flush_every:
            self._flush()

    def result(self) -> torch.Tensor:
        self._flush()
        return self.counts

    def _flush(self) -> None:
        if not self._pending:
            return
        ids = torch.tensor(self._pending, dtype=torch.int64)
        if int(ids.max()) >= len(self.counts):
            raise ValueError(
                f"token id {int(ids.max())} is outside the target vocabulary of {len(self.counts)}"
            )
        self.counts += torch.bincount(ids, minlength=len(self.counts))
        self._pending.clear()


def build_vocab_mapping(counts: torch.Tensor, draft_vocab_size: int) -> VocabMapping:
    """Top ``draft_vocab_size`` ids by count (ties: lower id first), sorted ascending by id."""
    if counts.dim() != 1:
        raise ValueError(f"counts must be 1-D [V], got shape {tuple(counts.shape)}")
    vocab_size = counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(
            f"draft_vocab_size must be in 1..{vocab_size} (target vocab), got {draft_vocab_size}"
        )
    counts = counts.to(torch.int64).cpu()
    # A stable descending sort keeps equal counts in ascending id order: lower id wins ties.
    order = torch.sort(counts, descending=True, stable=True).indices
    ids = torch.sort(order[:draft_vocab_size]).values
    d2t = ids - torch.arange(draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return VocabMapping(d2t=d2t, t2d=t2d, counts=counts)


def save_vocab_mapping(mapping: VocabMapping, path: str | Path) -> None:
    save_file(
        {
            "d2t": mapping.d2t.contiguous(),
            "t2d": mapping.t2d.contiguous(),
            "counts": mapping.counts.contiguous(),
        },
        str(path),
    )


def load_vocab_mapping(path: str | Path) -> VocabMapping:
    tensors = load_file(str(path))
    missing = {"d2t", "t2d", "counts"} - tensors.keys()
    if missing:
        raise ValueError(f"{path}: missing tensors {sorted(missing)}")
    mapping = VocabMapping(d2t=tensors["d2t"], t2d=tensors["t2d"], counts=tensors["counts"])
    if mapping.d2t.dtype != torch.int64 or mapping.t2d.dtype != torch.bool:
        raise ValueError(f"{path}: d2t must be int64 and t2d bool")
    if int(mapping.t2d.sum()) != len(mapping.d2t) or not bool(mapping.t2d[mapping.draft_ids].all()):
        raise ValueError(f"{path}: d2t and t2d disagree")
    return mapping


def save_token_counts(counts: torch.Tensor, path: str | Path) -> None:
    save_file({"counts": counts.to(torch.int64).contiguous()}, str(path))


def load_token_counts(path: str | Path) -> torch.Tensor:
    """The int64 ``[V]`` supervised-token counts of a prepared dataset."""
    tensors = load_file(str(path))
    counts = tensors.get("counts")
    if counts is None or counts.dtype != torch.int64 or counts.dim() != 1:
        raise ValueError(f"{path}: expected one int64 [V] tensor 'counts'")
    return counts
