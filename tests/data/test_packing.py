"""Packing (data.packing): micro-batches of whole rows of similar length to a token budget.

What a packed run must keep from the unpacked one: each row's loss (a packed micro-batch
pads its rows only to its own longest, an unpacked one to whichever row is longest among its
neighbours; neither padding may leak into any draft's attention, TTT chain, DFlash blocks or
P-EAGLE elements, nor into the target's features), every row once per epoch, and a
deterministic, resumable stream."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO, draft_vocab_sets
from run_configs import target_path

from eagle_train.config import ConfigError, load_config
from eagle_train.data.loader import Batch, BatchLoader, LoaderState, PreparedData
from eagle_train.drafts.registry import DRAFTS
from eagle_train.metrics import WeightedMean
from eagle_train.parallel import DistEnv
from eagle_train.run_config import RunConfig
from eagle_train.train_setup import build_components

# Per algorithm, settings under which a micro-batch's loss is a mean over supervised slots
# weighted by StepResult.weight (so one-row micro-batches average to the packed loss), and
# the block drafts scoring every valid anchor (their anchors are otherwise drawn per micro-batch shape).
EXACT = {
    "eagle1": ["draft.feature_noise=0"],
    "eagle3": ["draft.ttt_steps=1"],
    "peagle": [],
    "dflash": ["draft.num_anchors=512", "draft.loss=forward_kl"],
    "dspark": ["draft.num_anchors=512", "draft.loss=forward_kl"],
}
MAX_LENGTH = 96


def components(world: Path, data: Path, algorithm: str, *extra: str):
    sets = [
        f"target.path={target_path(world, 'llama', 'fp32')}",
        "target.dtype=float32",
        f"data.train={data}",
        "data.val=null",
        f"data.max_length={MAX_LENGTH}",
        "train.output_dir=/nonexistent",
        *draft_vocab_sets(algorithm),
        *extra,
    ]
    cfg = load_config(RunConfig, REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml", sets)
    torch.manual_seed(0)
    c = build_components(cfg, PreparedData(data), DistEnv())
    c.draft.float().eval()  # eval: P-EAGLE computes every element, DFlash a fixed anchor seed
    return cfg, c


@torch.no_grad()
def result(cfg, c, batch: Batch):
    return c.spec.compute_loss(c.draft, c.features.for_batch(batch), batch, cfg.draft)


def padded(batch: Batch, length: int, pad_id: int) -> Batch:
    """``batch`` right-padded to ``length`` (as an unpacked micro-batch with a longer row)."""
    extra = length - batch.input_ids.shape[1]

    def grow(x: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([x, x.new_full((x.shape[0], extra), value)], dim=1)

    return Batch(
        input_ids=grow(batch.input_ids, pad_id),
        loss_mask=grow(batch.loss_mask, 0),
        attention_mask=grow(batch.attention_mask, 0),
        lengths=batch.lengths,
        rows=batch.rows,
    )


def packed_epoch(data: PreparedData, budget: int) -> list[Batch]:
    loader = BatchLoader(data, 4, seed=3, pad_id=0, max_length=MAX_LENGTH, max_tokens=budget)
    return [loader.next() for _ in range(loader.batches_per_epoch)]


def test_packed_epoch_holds_every_row_once_within_the_budget(tiny_llama_data: Path):
    data = PreparedData(tiny_llama_data)
    lengths = [min(len(r), MAX_LENGTH) for r in data.rows["input_ids"]]
    budget = 160
    batches = packed_epoch(data, budget)
    rows = sorted(r for b in batches for r in b.rows.tolist())
    assert rows == list(range(len(data)))  # grad_accum 1: nothing cut at the epoch's end
    for b in batches:
        assert b.lengths.tolist() == [lengths[r] for r in b.rows.tolist()]
        # within the budget, or one row alone that is longer than it
        assert b.input_ids.numel() <= budget or len(b.lengths) == 1
    unpacked = BatchLoader(data, 4, seed=3, pad_id=0, max_length=MAX_LENGTH)
    plain = [unpacked.next() for _ in range(unpacked.batches_per_epoch)]

    def padding(bs: list[Batch]) -> float:
        return 1 - sum(int(b.lengths.sum()) for b in bs) / sum(b.input_ids.numel() for b in bs)

    assert padding(batches) < padding(plain) / 2  # similar lengths share a micro-batch


@pytest.mark.parametrize("algorithm", sorted(DRAFTS))
def test_packed_losses_equal_the_unpacked_losses_on_the_same_rows(
    tiny_world: Path, tiny_llama_data: Path, algorithm: str
):
    cfg, c = components(tiny_world, tiny_llama_data, algorithm, *EXACT[algorithm])
    data = PreparedData(tiny_llama_data)
    longest = max(min(len(r), MAX_LENGTH) for r in data.rows["input_ids"])
    batches = packed_epoch(data, 200)[:6]
    assert any(b.input_ids.shape[1] < longest for b in batches)  # padding really differs
    whole, alone = WeightedMean(), WeightedMean()
    single = BatchLoader(data, 1, seed=0, pad_id=0, max_length=MAX_LENGTH)
    # block drafts weight by anchors and average by slots: no per-row mean to compare with
    per_row = algorithm not in ("dflash", "dspark")
    for batch in batches:
        got = result(cfg, c, batch)
        # the same rows padded as an unpacked micro-batch holding the longest row would be
        want = result(cfg, c, padded(batch, longest, 0))
        assert got.weight == want.weight
        for key, value in want.metrics.items():
            assert got.metrics[key] == pytest.approx(value, abs=1e-5), key
        whole.add(got.metrics, got.weight)
        for row in batch.rows.tolist() if per_row else []:  # one row each: no padding at all
            one = result(cfg, c, single.collate([row]))
            alone.add(one.metrics, one.weight)
    if per_row:
        assert whole.result()["loss"] == pytest.approx(alone.result()["loss"], abs=1e-5)


def test_packing_is_deterministic_and_resumes_mid_epoch(tiny_llama_data: Path):
    data = PreparedData(tiny_llama_data)

    def loader(rank: int = 0, world: int = 1, accum: int = 1) -> BatchLoader:
        return BatchLoader(
            data, 4, seed=7, pad_id=0, max_length=MAX_LENGTH, rank=rank, world_size=world,
            grad_accum=accum, max_tokens=150,
        )  # fmt: skip

    single = loader(accum=2)
    n = single.batches_per_epoch
    stream = [single.next() for _ in range(n + 5)]  # across an epoch boundary
    assert single.state.epoch == 1
    assert n % 2 == 0
    again = loader(accum=2)
    assert all(torch.equal(a.input_ids, again.next().input_ids) for a in stream)
    # ranks take interleaved micro-batches of the one stream; a fresh loader at a saved
    # position continues it
    ranks = [loader(r, 2) for r in range(2)]
    for i in range(0, len(stream) - 1, 2):
        for r, rank_loader in enumerate(ranks):
            assert torch.equal(rank_loader.next().input_ids, stream[i + r].input_ids)
    resumed = loader(1, 2)
    resumed.state = LoaderState(epoch=0, offset=4)
    assert torch.equal(resumed.next().input_ids, stream[5].input_ids)
    # another epoch, another packing
    assert [b.rows.tolist() for b in stream[:3]] != [b.rows.tolist() for b in stream[n : n + 3]]


def test_budget_without_packing_is_refused(tiny_world: Path, tiny_llama_data: Path):
    with pytest.raises(ConfigError, match="max_tokens_per_batch.*packing"):
        components(
            tiny_world, tiny_llama_data, "eagle3", "data.packing=false",
            "data.max_tokens_per_batch=64",
        )  # fmt: skip
