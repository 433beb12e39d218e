"""Chat templates render exactly as transformers renders them, within a step budget that holds
in every thread (issue 59: a 10 s SIGALRM timer bounded the main thread only)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from data_fixtures import GENERATION_TEMPLATE, LLAMA3_TEMPLATE, build_tokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from eagle_train.chat_template import (
    MAX_STEPS,
    TemplateTooLargeError,
    chat_token_ids,
    render_chat,
)
from eagle_train.data import ChatRenderer
from eagle_train.demo.tokenizer import CHAT_TEMPLATE as DEMO_TEMPLATE

TEMPLATES = Path(__file__).parents[1] / "assets" / "chat_templates"
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HI = [{"role": "user", "content": "Hi"}]
# Templates a careful user may not notice are endless: each takes hours (or all memory)
# without the budget.
ENDLESS = {
    "nested ranges": LOOPS,
    "nested loops over a string": (
        "{% set s = 'x' * 90000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}"
    ),
    "a macro calling itself twice": (
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(60) }}"
    ),
    "a huge repeat": "{{ ('x' * 10000000000) | length }}",
    "a huge power": "{{ 10 ** 10000000000 }}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "a recursive loop": "{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}",
}


def conversation(num_messages: int, system: bool = True) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are terse."}] if system else []
    for i in range(num_messages // 2):
        messages.append({"role": "user", "content": f"Question {i}: what is {i} + {i}? ü 😀"})
        messages.append({"role": "assistant", "content": f"  {i} + {i} = {2 * i}.  "})
    return messages


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def refused_in_time(template: str, outcome: list) -> None:
    start = time.monotonic()
    renderer_source = "templates/endless.jinja"
    try:
        render_chat(template, HI, {}, source=renderer_source)
        outcome.append(("rendered", time.monotonic() - start))
    except TemplateTooLargeError as exc:
        outcome.append((str(exc), time.monotonic() - start))


@pytest.mark.parametrize("name", sorted(ENDLESS))
@pytest.mark.parametrize("where", ["main thread", "other thread"])
def test_endless_templates_are_refused_in_every_thread(name: str, where: str):
    """Before: refused after 10 s on the main thread, rendered forever on any other."""
    outcome: list = []
    if where == "main thread":
        refused_in_time(ENDLESS[name], outcome)
    else:
        thread = threading.Thread(target=refused_in_time, args=(ENDLESS[name], outcome))
        thread.start()
        thread.join(timeout=20)
        assert not thread.is_alive()
    [(message, seconds)] = outcome
    assert message.startswith("templates/endless.jinja: the chat template ")
    assert "\n" not in message
    if "recurs" not in message:
        assert f"{MAX_STEPS:,} + 1,000 per message" in message
    assert seconds < 2.0


def test_budgets_of_threads_are_their_own(tokenizer):
    """Eight threads rendering a real template at once, one an endless one: each real render
    is whole (a shared counter would refuse them or let the endless one run)."""
    renderer = ChatRenderer(tokenizer, LLAMA3_TEMPLATE, source="llama3.jinja")
    messages = conversation(400)
    expected = tokenizer.apply_chat_template(
        messages, chat_template=LLAMA3_TEMPLATE, tokenize=False
    )
    results: dict[int, object] = {}

    def work(i: int) -> None:
        try:
            if i == 0:
                render_chat(LOOPS, HI, {}, source="endless")
            for _ in range(3):
                results[i] = renderer.render(messages, where=f"thread {i}")
        except TemplateTooLargeError as exc:
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert isinstance(results[0], TemplateTooLargeError)
    assert all(results[i] == expected for i in range(1, 8))


def test_refusal_through_the_renderer_names_template_and_record(tokenizer):
    renderer = ChatRenderer(tokenizer, LOOPS + "{{ messages[0].content }}", source="my.jinja")
    with pytest.raises(TemplateTooLargeError, match=r"^my\.jinja \(chats\.jsonl:3\): the chat"):
        renderer.render(HI, where="chats.jsonl:3")


# Written without whitespace control: its text depends on trim_blocks and lstrip_blocks, and
# on transformers' tojson (no HTML escaping, non-ASCII kept).
HAND_WRITTEN = """{% if messages[0].role == 'system' %}
  {% set system = messages[0] | tojson %}
{% endif %}
{% for message in messages %}
    {% if message.role not in ['system', 'user', 'assistant'] %}
{{ raise_exception('unknown role') }}
    {% endif %}
[{{ loop.index }}/{{ loop.length }}] {{ message.role }} <{{ message.content | tojson }}>
{% endfor %}
{% if add_generation_prompt %}
assistant{{ eos_token }} {{ system }}
{% endif %}
"""


def shipped_templates() -> list[tuple[str, str]]:
    found = [(p.name, p.read_text()) for p in sorted(TEMPLATES.glob("*.jinja"))]
    return [
        *found,
        ("demo world", DEMO_TEMPLATE),
        ("llama3 (tests)", LLAMA3_TEMPLATE),
        ("hand-written", HAND_WRITTEN),
    ]


@pytest.mark.parametrize("name, template", shipped_templates(), ids=lambda x: x[:20])
@pytest.mark.parametrize("num_messages", [2, 500])
def test_real_templates_render_as_transformers_does(tokenizer, name, template, num_messages):
    """Compared with apply_chat_template's own text: a template compiled or called with other
    options, filters or variables than transformers' renders differently, and a budget that
    refuses real use raises."""
    if name.startswith("demo"):
        messages = conversation(num_messages, system=False)
    else:
        messages = conversation(num_messages)
    renderer = ChatRenderer(tokenizer, template, source=name)
    for cut in {len(messages), len(messages) - 1, 2}:
        for generation in (False, True):
            theirs = tokenizer.apply_chat_template(
                messages[:cut],
                chat_template=template,
                tokenize=False,
                add_generation_prompt=generation,
            )
            ours = renderer.render(messages[:cut], add_generation_prompt=generation)
            assert ours == theirs


def test_template_kwargs_and_special_tokens_reach_the_template(tokenizer):
    template = (TEMPLATES / "qwen3.jinja").read_text()
    messages = conversation(6)
    for kwargs in ({"enable_thinking": False}, {"enable_thinking": True}, {}):
        theirs = tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=True, **kwargs
        )
        ours = ChatRenderer(tokenizer, template, kwargs).render(
            messages, add_generation_prompt=True
        )
        assert ours == theirs
    uses_bos = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert ChatRenderer(tokenizer, uses_bos).render(HI) == tokenizer.apply_chat_template(
        HI, chat_template=uses_bos, tokenize=False
    )


def test_generation_spans_as_transformers_reports_them(tokenizer):
    messages = conversation(500)
    variables = dict(tokenizer.special_tokens_map)
    spans: list[tuple[int, int]] = []
    ours = render_chat(GENERATION_TEMPLATE, messages, variables, spans=spans)
    (theirs,), (their_spans,) = render_jinja_template(
        conversations=[messages],
        chat_template=GENERATION_TEMPLATE,
        return_assistant_tokens_mask=True,
        **variables,
    )
    assert (ours, spans) == (theirs, their_spans)
    assert len(spans) == 250


def test_token_ids_as_apply_chat_template_gives_them(tokenizer):
    """What eval-acceptance and build-long-prompts serve: the same ids as transformers."""
    messages = conversation(41)
    theirs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    ours = chat_token_ids(tokenizer, messages, add_generation_prompt=True, source="tok")
    assert ours == list(theirs)
