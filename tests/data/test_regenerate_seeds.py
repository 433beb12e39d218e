"""Each turn of a regenerated record gets its own seed, as the written records show: a backend
whose answer depends only on the seed it is handed for a request (as vLLM's sampled output
does) answers every turn of every record differently, the same under another batch size,
and differently under another regenerate.seed. Records and turns come in counts that do not
divide each other (tests/realistic.py), so a seed derived from a batch position or a turn
index alone repeats somewhere."""

from __future__ import annotations

import json

import pytest
from data_fixtures import build_tokenizer, chat, write_jsonl
from realistic import counts

from eagle_train.data import PrepareDataConfig, prepare_data
from eagle_train.data import prepare as prepare_module
from eagle_train.data.generation import cut_at_stop


class SeedEcho:
    """Answers "sample <seed>": what a seeded sampler does, made visible."""

    name = "seed-echo"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, max_new_tokens, seeds, sampling=None):
        replies = [self.tokenizer.encode(f"sample {s}") + [self.stop] for s in seeds]
        return [
            cut_at_stop(r, (self.stop,), n) for r, n in zip(replies, max_new_tokens, strict=True)
        ]

    def close(self):
        pass


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    return path


def records() -> list[dict]:
    """7 records of 1, 3 or 5 turns (the realistic counts): 19 assistant turns."""
    out = []
    for i in range(counts(3)[2]):
        turns = counts(2)[i % 2] if i % 3 else 1
        messages = [text for t in range(turns) for text in (f"question {t} of {i}", "old")]
        out.append({"id": f"r{i}", "messages": chat(*messages)})
    return out


def regenerated(tmp_path, tokenizer_dir, monkeypatch, **regen) -> dict[str, list[str]]:
    from transformers import AutoTokenizer

    tmp_path.mkdir()
    backend = SeedEcho(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    monkeypatch.setattr(prepare_module, "create_backend", lambda *a, **k: backend)
    cfg = PrepareDataConfig(
        inputs=[write_jsonl(tmp_path / "in.jsonl", records())],
        output_dir=tmp_path / "out",
        tokenizer=tokenizer_dir,
        regenerate={"enabled": True, "max_new_tokens": 16, "temperature": 0.8, **regen},
    )
    path = prepare_data(cfg).regeneration.path
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {
        r["id"]: [m["content"] for m in r["messages"] if m["role"] == "assistant"] for r in rows
    }


def test_each_turn_of_each_record_is_sampled_with_its_own_seed(
    tmp_path, tokenizer_dir, monkeypatch
):
    batched = regenerated(tmp_path / "a", tokenizer_dir, monkeypatch, batch_size=counts(1)[0])
    answers = [a for turns in batched.values() for a in turns]
    assert len(answers) == 19 and all(a.startswith("sample ") for a in answers)
    assert len(set(answers)) == len(answers)  # no two turns, of one record or two, share one
    # the seed follows the record and the turn, not the batch a turn was generated in
    alone = regenerated(tmp_path / "b", tokenizer_dir, monkeypatch, batch_size=1)
    assert alone == batched
    # and the configured seed: another one samples every turn anew
    other = regenerated(tmp_path / "c", tokenizer_dir, monkeypatch, seed=7)
    assert sorted(other) == sorted(batched)
    assert all(x != y for r in batched for x, y in zip(batched[r], other[r], strict=True))
