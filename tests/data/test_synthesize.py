"""Prompt synthesis: the template's user-turn opening, one seed per request, filter, dedupe."""

from __future__ import annotations

import json

import pytest
from data_fixtures import CHATML_DEFAULT_SYSTEM_TEMPLATE, build_tokenizer

from eagle_train.data import ChatRenderer, DataError
from eagle_train.data.config import SynthesizeConfig
from eagle_train.data.synthesize import synthesize_prompts, user_turn_opening

# What a "model" writes for request seed s: duplicates (case and spaces differ), a one-word
# prompt, one cut at the token limit (no stop token), one holding template markup.
SAMPLES = {
    0: "How do  tides work?",
    1: "how do tides work?",
    2: "Why",
    3: "Explain the water cycle briefly.",
    4: "CUT",
    5: "Name <|im_start|> three colours.",
    6: "What is a prime number?",
}


class FakeBackend:
    name = "fake"

    def __init__(self, tokenizer, stop_id):
        self.tok, self.stop_id, self.calls = tokenizer, stop_id, []

    def generate(self, prompts, max_new_tokens, seeds, sampling=None):
        self.calls.append((prompts, max_new_tokens, seeds, sampling))
        out = []
        for seed in seeds:
            text = SAMPLES.get(seed, f"Question number {seed} is here?")
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            out.append(ids if text == "CUT" else ids + [self.stop_id])
        return out


@pytest.fixture(scope="module")
def renderer(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("tok"), CHATML_DEFAULT_SYSTEM_TEMPLATE)
    return ChatRenderer(tok)


def test_user_turn_opening(renderer):
    assert user_turn_opening(renderer, None) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    )
    assert user_turn_opening(renderer, "Be terse.") == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n"
    )


def test_synthesize_filters_dedupes_and_seeds_each_request(renderer, tmp_path):
    tok = renderer.tokenizer
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    backend = FakeBackend(tok, stop)
    cfg = SynthesizeConfig(
        enabled=True, num_prompts=4, batch_size=3, seed=0, min_words=2, temperature=0.9
    )
    path = tmp_path / "prompts.jsonl"
    report = synthesize_prompts(renderer, backend, cfg, (stop,), path)
    # Requests go in batches of 3 until 4 prompts are kept: seeds 0..8, each used once.
    seeds = [s for call in backend.calls for s in call[2]]
    assert seeds == list(range(9))
    opening = renderer.encode(user_turn_opening(renderer, None))
    assert all(p == opening for call in backend.calls for p in call[0])
    assert {(c[3].temperature, c[3].top_p) for c in backend.calls} == {(0.9, 0.95)}
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["messages"] for r in rows] == [
        [{"role": "user", "content": "How do tides work?"}],
        [{"role": "user", "content": "Explain the water cycle briefly."}],
        [{"role": "user", "content": "What is a prime number?"}],
        [{"role": "user", "content": "Question number 7 is here?"}],
    ]
    assert [r["id"] for r in rows] == [f"synth-{i:06d}" for i in range(4)]
    assert report.requests == 9 and report.kept == 4
    assert report.rejected == {
        "duplicate": 1,
        "too_short": 1,
        "cut_at_limit": 1,
        "template_markup": 1,
    }


def test_nothing_kept_is_an_error_and_writes_nothing(renderer, tmp_path):
    tok = renderer.tokenizer
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = SynthesizeConfig(enabled=True, num_prompts=2, max_requests=3, min_words=50)
    path = tmp_path / "prompts.jsonl"
    with pytest.raises(DataError, match="no usable prompts synthesised"):
        synthesize_prompts(renderer, FakeBackend(tok, stop), cfg, (stop,), path)
    assert not path.exists()


class StemBackend(FakeBackend):
    """Continues every prompt with " part <seed>." (so each kept prompt is stem + that)."""

    def generate(self, prompts, max_new_tokens, seeds, sampling=None):
        self.calls.append((prompts, max_new_tokens, seeds, sampling))
        return [
            self.tok(f" part {s}.", add_special_tokens=False)["input_ids"] + [self.stop_id]
            for s in seeds
        ]


def test_stems_open_each_request_in_turn(renderer, tmp_path):
    tok = renderer.tokenizer
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    stems = tmp_path / "stems.txt"
    stems.write_text("Write a poem about\n\n  Explain  \n")
    backend = StemBackend(tok, stop)
    cfg = SynthesizeConfig(enabled=True, num_prompts=3, batch_size=2, seed=10, stems=stems)
    path = tmp_path / "prompts.jsonl"
    synthesize_prompts(renderer, backend, cfg, (stop,), path)
    opening = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    expected = [
        tok(opening + s, add_special_tokens=False)["input_ids"]
        for s in ("Write a poem about", "Explain")
    ]
    sent = [p for call in backend.calls for p in call[0]]
    assert sent == [expected[0], expected[1], expected[0], expected[1]]  # two batches of 2
    rows = [json.loads(line)["messages"][0]["content"] for line in path.read_text().splitlines()]
    assert rows == [
        "Write a poem about part 10.",
        "Explain part 11.",
        "Write a poem about part 12.",
    ]


def test_builtin_stems_and_bad_stem_files(renderer, tmp_path):
    from eagle_train.data.stems import BUILTIN, load_stems

    assert load_stems("builtin") == BUILTIN and len(set(BUILTIN)) == len(BUILTIN) >= 30
    assert load_stems(None) == ()
    with pytest.raises(DataError, match=r"synthesize.stems: .*missing.txt: unreadable"):
        load_stems(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(DataError, match=r"empty.txt: expected one stem per line"):
        load_stems(tmp_path / "empty.txt")


def test_follow_ups_make_two_user_turns(renderer, tmp_path):
    import random

    from eagle_train.data.stems import FOLLOW_UPS, load_follow_ups

    tok = renderer.tokenizer
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    follow = tmp_path / "follow.txt"
    follow.write_text("Shorter, please.\n\nNow in French.\n")
    cfg = SynthesizeConfig(enabled=True, num_prompts=4, batch_size=8, seed=3, follow_ups=follow)
    path = tmp_path / "prompts.jsonl"
    synthesize_prompts(renderer, FakeBackend(tok, stop), cfg, (stop,), path)
    records = [json.loads(line)["messages"] for line in path.read_text().splitlines()]
    # Hand-written: Random(3) picks these four (checked against the list's two lines).
    rng = random.Random(3)
    picks = [rng.choice(["Shorter, please.", "Now in French."]) for _ in range(4)]
    assert len(set(picks)) == 2  # the seed draws both, so a constant pick would fail
    assert [[m["role"] for m in r] for r in records] == [["user", "assistant", "user"]] * 4
    assert [r[1]["content"] for r in records] == [""] * 4
    assert [r[2]["content"] for r in records] == picks
    assert load_follow_ups("builtin") == FOLLOW_UPS and len(set(FOLLOW_UPS)) >= 30
    assert load_follow_ups(None) == ()
    with pytest.raises(DataError, match=r"synthesize.follow_ups: .*none.txt: unreadable"):
        load_follow_ups(tmp_path / "none.txt")
