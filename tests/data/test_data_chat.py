"""Golden loss masks: exactly the assistant tokens (content + end-of-turn token) are 1."""

from __future__ import annotations

import pytest
from data_fixtures import (
    CHATML_DEFAULT_SYSTEM_TEMPLATE,
    CHATML_TEMPLATE,
    CHATML_THINK_IN_PROMPT_TEMPLATE,
    CHATML_THINK_TEMPLATE,
    GENERATION_TEMPLATE,
    LLAMA3_TEMPLATE,
    NO_ASSISTANT_TEMPLATE,
    QWEN3_HISTORY_TEMPLATE,
    build_tokenizer,
    chat,
)

from eagle_train.data import ChatRenderer, DataError, mask_from_offsets

THINK = "<think>\n\n</think>\n\n"
# Multi-turn, with a system prompt, unicode, digits and leading/trailing spaces to trim.
MESSAGES = chat(
    "Hello there, how are you?",
    "I am fine: thank you 42 times!",
    "Tell me about the sea ü 😀",
    "  The sea is large and blue.  ",
    "And the sun?",
    "Hot.\nVery hot.",
    system="You are a helpful assistant.",
)
ASSISTANT = [m["content"] for m in MESSAGES if m["role"] == "assistant"]

GOLDEN = {
    "llama3": (LLAMA3_TEMPLATE, [a.strip() + "<|eot_id|>" for a in ASSISTANT]),
    "chatml": (CHATML_TEMPLATE, [a + "<|im_end|>" for a in ASSISTANT]),
    "chatml_default_system": (
        CHATML_DEFAULT_SYSTEM_TEMPLATE,
        [a + "<|im_end|>" for a in ASSISTANT],
    ),
    "chatml_think": (CHATML_THINK_TEMPLATE, [THINK + a + "<|im_end|>" for a in ASSISTANT]),
    "chatml_think_in_prompt": (
        CHATML_THINK_IN_PROMPT_TEMPLATE,
        [a + "<|im_end|>" for a in ASSISTANT],
    ),
    "generation_tags": (GENERATION_TEMPLATE, [a + "<|im_end|>" for a in ASSISTANT]),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _runs(ids, mask, value):
    """Maximal runs of consecutive tokens whose mask equals ``value``."""
    runs, current = [], []
    for token, m in zip(ids, mask, strict=True):
        if m == value:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def _split_around(text, pieces):
    """``text`` minus ``pieces`` (found in order): the parts that must stay unmasked."""
    out, pos = [], 0
    for piece in pieces:
        start = text.index(piece, pos)
        out.append(text[pos:start])
        pos = start + len(piece)
    return [p for p in out + [text[pos:]] if p]


def assert_golden(renderer, messages, expected):
    tok = renderer.tokenizer
    result = renderer.tokenize_rows(messages, 4096, "golden.jsonl:1")[0]
    text = renderer.render(messages)
    assert _decode(tok, result.input_ids) == text  # tokenized once, nothing lost or added
    assert len(result.loss_mask) == len(result.input_ids)
    assert [_decode(tok, r) for r in _runs(result.input_ids, result.loss_mask, 1)] == expected
    # Everything else (system, user, headers, generation prompts) is 0.
    unmasked = [_decode(tok, r) for r in _runs(result.input_ids, result.loss_mask, 0)]
    assert unmasked == _split_around(text, expected)
    for msg in messages:
        if msg["role"] != "assistant":
            assert any(msg["content"].strip() in part for part in unmasked)


@pytest.mark.parametrize("family", sorted(GOLDEN))
def test_golden_masks(tokenizer, family):
    template, expected = GOLDEN[family]
    renderer = ChatRenderer(tokenizer, template)
    assert renderer.uses_generation_blocks == (family == "generation_tags")
    assert_golden(renderer, MESSAGES, expected)
    # Without the system message (the default-system template injects its own).
    assert_golden(renderer, MESSAGES[1:], expected)


def test_default_system_message_is_unmasked(tokenizer):
    renderer = ChatRenderer(tokenizer, CHATML_DEFAULT_SYSTEM_TEMPLATE)
    result = renderer.tokenize_rows(MESSAGES[1:], 4096, "x:1")[0]
    text = _decode(
        tokenizer, [t for t, m in zip(result.input_ids, result.loss_mask, strict=True) if m == 0]
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")


def test_generation_tags_agree_with_transformers(tokenizer):
    """Our mask for a {% generation %} template equals apply_chat_template's assistant mask."""
    renderer = ChatRenderer(tokenizer, GENERATION_TEMPLATE)
    ours = renderer.tokenize_rows(MESSAGES, 4096, "x:1")[0]
    theirs = tokenizer.apply_chat_template(
        MESSAGES,
        chat_template=GENERATION_TEMPLATE,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    assert ours.input_ids == list(theirs["input_ids"])
    assert ours.loss_mask == list(theirs["assistant_masks"])
    # ... and the prefix-diff method on the same rendering gives the same mask.
    plain = ChatRenderer(tokenizer, CHATML_TEMPLATE).tokenize_rows(MESSAGES, 4096, "x:1")[0]
    assert (plain.input_ids, plain.loss_mask) == (ours.input_ids, ours.loss_mask)


def test_template_bos_is_not_doubled(tmp_path, tokenizer):
    from tokenizers import processors
    from transformers import AutoTokenizer

    bos = tokenizer.bos_token_id
    result = ChatRenderer(tokenizer, LLAMA3_TEMPLATE).tokenize_rows(MESSAGES, 4096, "x:1")[0]
    assert result.input_ids.count(bos) == 1 and result.input_ids[0] == bos
    # A tokenizer that adds bos itself: added once for a template without bos, not for one with.
    tokenizer.save_pretrained(str(tmp_path))
    adds_bos = AutoTokenizer.from_pretrained(str(tmp_path))
    adds_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    for template in (LLAMA3_TEMPLATE, CHATML_TEMPLATE):
        renderer = ChatRenderer(adds_bos, template)
        result = renderer.tokenize_rows(MESSAGES, 4096, "x:1")[0]
        assert result.input_ids.count(bos) == 1 and result.input_ids[0] == bos
        assert result.loss_mask[0] == 0
        assert (
            renderer.encode(renderer.render(MESSAGES[:2], add_generation_prompt=True)).count(bos)
            == 1
        )


def test_truncation_cuts_ids_and_mask(tokenizer):
    renderer = ChatRenderer(tokenizer, CHATML_TEMPLATE)
    full = renderer.tokenize_rows(MESSAGES, 4096, "x:1")[0]
    cut = renderer.tokenize_rows(MESSAGES, 40, "x:1")[0]
    assert cut.truncated and not full.truncated
    assert cut.input_ids == full.input_ids[:40]
    assert cut.loss_mask == full.loss_mask[:40]
    prompt_only = renderer.tokenize_rows(MESSAGES, 5, "x:1")[0]
    assert prompt_only.num_assistant_tokens == 0


def test_template_not_prefix_consistent_gives_one_row_per_turn(tokenizer):
    renderer = ChatRenderer(tokenizer, QWEN3_HISTORY_TEMPLATE)
    # One assistant turn renders consistently: one row.
    assert len(renderer.tokenize_rows(MESSAGES[:3], 4096, "data/chats.jsonl:7")) == 1
    # Three do not (an earlier turn loses its think block once a later user turn exists): one
    # row per turn, each the conversation up to that turn as served, earlier turns without
    # the think block, the current one with it (the model generates it).
    rows = renderer.training_rows(MESSAGES, "data/chats.jsonl:7")
    sys_text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    u = [m["content"] for m in MESSAGES if m["role"] == "user"]
    a = ASSISTANT
    hist1 = f"<|im_start|>user\n{u[0]}<|im_end|>\n<|im_start|>assistant\n{a[0]}<|im_end|>\n"
    hist2 = f"<|im_start|>user\n{u[1]}<|im_end|>\n<|im_start|>assistant\n{a[1]}<|im_end|>\n"
    prompts = [
        sys_text + f"<|im_start|>user\n{u[0]}<|im_end|>\n<|im_start|>assistant\n",
        sys_text + hist1 + f"<|im_start|>user\n{u[1]}<|im_end|>\n<|im_start|>assistant\n",
        sys_text + hist1 + hist2 + f"<|im_start|>user\n{u[2]}<|im_end|>\n<|im_start|>assistant\n",
    ]
    assert len(rows) == 3
    for (text, spans), prompt, answer in zip(rows, prompts, a, strict=True):
        assert text == prompt + THINK + answer + "<|im_end|>\n"
        assert spans == [(len(prompt), len(text) - 1)]
    tokenized = renderer.tokenize_rows(MESSAGES, 4096, "data/chats.jsonl:7")
    for row, answer in zip(tokenized, a, strict=True):
        masked = [t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m]
        assert _decode(tokenizer, masked) == THINK + answer + "<|im_end|>"


def test_prompt_that_changes_once_answered_uses_the_served_prompt(tokenizer):
    # The generation prompt says "bot" but answered turns are rendered "assistant": the row is
    # the prompt as served plus the answer as the template writes it.
    template = CHATML_TEMPLATE.replace(
        "{% if add_generation_prompt %}<|im_start|>assistant", "{% if add_generation_prompt %}bot"
    )
    rows = ChatRenderer(tokenizer, template).training_rows(MESSAGES[:3], "x:1")
    prompt = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello there, how are you?<|im_end|>\nbot\n"
    )
    assert rows == [(prompt + ASSISTANT[0] + "<|im_end|>\n", [(len(prompt), len(prompt) + 40)])]


def test_answer_not_rendered_verbatim_after_a_changed_prompt_is_an_error(tokenizer):
    # ...and when the answer is not written verbatim either, nothing can be marked.
    template = CHATML_TEMPLATE.replace(
        "{% if add_generation_prompt %}<|im_start|>assistant", "{% if add_generation_prompt %}bot"
    ).replace("{{ m['content'] }}", "{{ m['content'] | reverse }}")
    with pytest.raises(DataError) as info:
        ChatRenderer(tokenizer, template).tokenize_rows(MESSAGES, 4096, "data/chats.jsonl:7")
    assert str(info.value).startswith("data/chats.jsonl:7: assistant message 3: the chat")
    assert info.value.reason == "template_not_prefix_consistent"


def test_template_without_assistant_spans_is_an_error(tokenizer):
    with pytest.raises(DataError, match="data/chats.jsonl:3"):
        ChatRenderer(tokenizer, NO_ASSISTANT_TEMPLATE).tokenize_rows(
            MESSAGES, 4096, "data/chats.jsonl:3"
        )[0]
    unmarked = GENERATION_TEMPLATE.replace("{% generation %}", "").replace(
        "{% endgeneration %}", ""
    )
    unmarked += "{# {% generation %} mentioned, never used #}"
    with pytest.raises(DataError, match="data/chats.jsonl:3: chat template does not mark any"):
        ChatRenderer(tokenizer, unmarked).tokenize_rows(MESSAGES, 4096, "data/chats.jsonl:3")[0]


def test_assistant_first_is_an_error(tokenizer):
    messages = [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "yo"}]
    with pytest.raises(DataError, match="a.jsonl:2: the conversation starts with an assistant"):
        ChatRenderer(tokenizer, CHATML_TEMPLATE).tokenize_rows(messages, 4096, "a.jsonl:2")[0]


def test_mask_from_offsets_rules():
    spans = [(5, 10), (20, 30)]
    offsets = [(0, 0), (0, 5), (5, 7), (7, 10), (10, 20), (20, 30), (30, 31)]
    assert mask_from_offsets(offsets, spans, "x:1") == [0, 0, 1, 1, 0, 1, 0]
    # Bytes of one character share its offsets: all inside or all outside together.
    assert mask_from_offsets([(4, 5), (5, 6), (5, 6), (6, 10)], [(5, 10)], "x:1") == [0, 1, 1, 1]
    for straddling in ([(3, 6)], [(9, 12)], [(4, 11)]):
        with pytest.raises(DataError, match="x:1: token at characters .* straddles"):
            mask_from_offsets(straddling, spans, "x:1")


def test_end_of_turn_text(tokenizer):
    assert ChatRenderer(tokenizer, CHATML_TEMPLATE).end_of_turn_text() == "<|im_end|>"
    assert ChatRenderer(tokenizer, LLAMA3_TEMPLATE).end_of_turn_text() == "<|eot_id|>"
    assert ChatRenderer(tokenizer, GENERATION_TEMPLATE).end_of_turn_text() == "<|im_end|>"


def test_missing_chat_template_is_an_error(tokenizer):
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = None
    with pytest.raises(DataError, match="no chat template"):
        ChatRenderer(tokenizer)
