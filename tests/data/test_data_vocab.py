"""Draft vocabulary mapping: top-Vd by count, ties to the lower id, ascending, offsets; and the
mapping the trainer builds from the counts prepare-data writes (draft.draft_vocab_size)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
import torch
from data_fixtures import build_tokenizer, chat, write_jsonl
from old_formats import as_dataset_before_token_counts

from eagle_train.config import ConfigError, load_config
from eagle_train.data import (
    PrepareDataConfig,
    PreparedDataError,
    TokenCounter,
    build_vocab_mapping,
    load_prepared,
    load_vocab_mapping,
    prepare_data,
    save_token_counts,
    save_vocab_mapping,
)
from eagle_train.data.loader import PreparedData
from eagle_train.run_config import RunConfig
from eagle_train.train_setup import draft_vocab

REPO = Path(__file__).resolve().parents[2]


def test_known_counts():
    #                      id: 0  1  2  3  4  5  6  7  8  9
    counts = torch.tensor([0, 5, 9, 5, 0, 7, 5, 1, 9, 2])
    mapping = build_vocab_mapping(counts, 5)
    # top 5: 2 (9), 8 (9), 5 (7), then 1, 3, 6 tie at 5 -> 1 and 3 (lower ids) win.
    assert mapping.draft_ids.tolist() == [1, 2, 3, 5, 8]
    assert mapping.d2t.tolist() == [1, 1, 1, 2, 4]
    assert mapping.d2t.dtype == torch.int64
    assert mapping.t2d.dtype == torch.bool and mapping.t2d.shape == (10,)
    assert mapping.t2d.nonzero().flatten().tolist() == [1, 2, 3, 5, 8]
    # target_id = draft_id + d2t[draft_id]
    for draft_id, target_id in enumerate([1, 2, 3, 5, 8]):
        assert draft_id + int(mapping.d2t[draft_id]) == target_id


def test_ties_and_zero_counts_fill_by_lowest_id():
    mapping = build_vocab_mapping(torch.tensor([0, 0, 3, 0, 0, 0]), 3)
    assert mapping.draft_ids.tolist() == [0, 1, 2]
    assert mapping.d2t.tolist() == [0, 0, 0]
    full = build_vocab_mapping(torch.tensor([4, 1, 3]), 3)
    assert full.d2t.tolist() == [0, 0, 0] and bool(full.t2d.all())


def test_invalid_sizes():
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_vocab_mapping(torch.ones(4, dtype=torch.int64), 5)
    with pytest.raises(ValueError, match="1-D"):
        build_vocab_mapping(torch.ones(2, 2, dtype=torch.int64), 1)


def test_counts_from_several_ranks_add_up():
    """What a distributed trainer does: count per rank, all-reduce (a sum), then build."""
    ranks = [TokenCounter(8), TokenCounter(8)]
    ranks[0].add([1, 2, 2, 7], [0, 1, 1, 1])
    ranks[1].add([2, 3, 3, 3], [1, 1, 1, 0])
    total = ranks[0].result() + ranks[1].result()
    assert total.tolist() == [0, 0, 3, 2, 0, 0, 0, 1]
    assert build_vocab_mapping(total, 2).draft_ids.tolist() == [2, 3]


def test_counter_flushes_and_checks_ids():
    counter = TokenCounter(4, flush_every=3)
    for _ in range(5):
        counter.add([0, 1, 3], [1, 1, 1])
    assert counter.result().tolist() == [5, 5, 0, 5]
    bad = TokenCounter(4)
    bad.add([4], [1])
    with pytest.raises(ValueError, match="outside the target vocabulary of 4"):
        bad.result()


def test_save_and_load(tmp_path):
    mapping = build_vocab_mapping(torch.tensor([3, 0, 2, 9, 1]), 3)
    save_vocab_mapping(mapping, tmp_path / "vocab.safetensors")
    loaded = load_vocab_mapping(tmp_path / "vocab.safetensors")
    assert torch.equal(loaded.d2t, mapping.d2t)
    assert torch.equal(loaded.t2d, mapping.t2d)
    assert torch.equal(loaded.counts, mapping.counts)


def _prepared(tmp_path: Path) -> tuple[Path, int]:
    """prepare-data on three chats with the test BPE tokenizer (V = len(tokenizer) = 33,012:
    500 pieces, the learned ones above 32,767)."""
    tok = tmp_path / "tok"
    tokenizer = build_tokenizer(tok)
    chats = [
        {"messages": chat("Sort 3 1 2", "1 2 3")},
        {"messages": chat("Hello there", "Hi! Hi! How can I help?")},
        {"messages": chat("What is the sun?", "A star. A big star.", system="Be brief.")},
    ]
    out = tmp_path / "data"
    prepare_data(
        PrepareDataConfig(
            inputs=[write_jsonl(tmp_path / "in.jsonl", chats)], output_dir=out, tokenizer=tok
        )
    )
    return out, len(tokenizer)


def _reference_ids(data: Path, vocab_size: int, size: int) -> list[int]:
    """By hand: count the supervised tokens of the rows, take the ``size`` most frequent
    (ties: lower id), ascending."""
    counts = collections.Counter()
    for row in load_prepared(data):
        counts.update(t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    ranked = sorted(range(vocab_size), key=lambda t: (-counts[t], t))
    return sorted(ranked[:size])


def _run_config(data: Path, *sets: str) -> RunConfig:
    path = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"
    return load_config(RunConfig, path, ["target.path=t", f"data.train={data}", *sets])


def test_the_trainer_builds_the_configured_mapping_from_prepare_datas_counts(tmp_path, caplog):
    data, vocab_size = _prepared(tmp_path)
    supervised = collections.Counter()
    for row in load_prepared(data):
        supervised.update(t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    for size in (7, 20):
        cfg = _run_config(data, f"draft.draft_vocab_size={size}")
        caplog.clear()
        with caplog.at_level("INFO", logger="eagle_train.train_setup"):
            mapping = draft_vocab(cfg, PreparedData(data), vocab_size)
        assert mapping.draft_ids.tolist() == _reference_ids(data, vocab_size, size)
        assert int(mapping.t2d.sum()) == size
        # The log says how much of the supervised text the vocabulary can propose.
        share = sum(supervised[t] for t in _reference_ids(data, vocab_size, size))
        share = 100 * share / sum(supervised.values())
        assert f"it covers {share:.1f}% of them ({len(supervised)} distinct ids" in caplog.text
    nothing = _run_config(data, "draft.draft_vocab_size=null")
    assert draft_vocab(nothing, PreparedData(data), vocab_size) is None  # the whole vocabulary
    over = f"draft.draft_vocab_size={vocab_size + 1}"
    with pytest.raises(ConfigError, match=f"{over.replace('=', ' ')} is larger than the target"):
        draft_vocab(_run_config(data, over), PreparedData(data), vocab_size)


def test_the_trainer_reads_the_counts_instead_of_recounting(tmp_path):
    data, vocab_size = _prepared(tmp_path)
    # Counts that disagree with the rows (the highest ids most frequent): the mapping follows
    # the file, so the trainer did not count the rows again.
    save_token_counts(torch.arange(vocab_size), data / "token_counts.safetensors")
    meta = json.loads((data / "meta.json").read_text())
    meta["files"]["token_counts.safetensors"] = (data / "token_counts.safetensors").stat().st_size
    (data / "meta.json").write_text(json.dumps(meta))
    cfg = _run_config(data, "draft.draft_vocab_size=4")
    top = list(range(vocab_size - 4, vocab_size))  # ids above 32,767
    assert draft_vocab(cfg, PreparedData(data), vocab_size).draft_ids.tolist() == top
    with pytest.raises(
        PreparedDataError, match=f"token counts over {vocab_size} ids, but the target vo"
    ):
        draft_vocab(cfg, PreparedData(data), vocab_size + 140)


def test_older_datasets_without_the_counts_still_train(tmp_path):
    # Datasets as prepare-data wrote them before the counts (tests/old_formats.py): with the
    # draft vocabulary of another size it built then, the trainer builds the configured size
    # from the counts that file holds; with neither file, it counts the rows itself.
    for vocab_then in (3, None):
        data, vocab_size = _prepared(tmp_path / str(vocab_then))
        cfg = _run_config(data, "draft.draft_vocab_size=9")
        expected = _reference_ids(data, vocab_size, 9)
        as_dataset_before_token_counts(data, vocab_then)
        assert "token_counts" not in json.loads((data / "meta.json").read_text())
        assert (PreparedData(data).token_counts is None) == (vocab_then is None)
        assert draft_vocab(cfg, PreparedData(data), vocab_size).draft_ids.tolist() == expected
