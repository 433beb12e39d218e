"""Chat templates rendered as transformers renders them, within a step budget, in any thread.

transformers renders a chat template in jinja2's ``ImmutableSandboxedEnvironment``
(``transformers.utils.chat_template_utils``): the sandbox keeps a template away from Python,
not from looping; its ``range`` allows 100,000 items, and two nested loops over it are 10**10
steps. This module compiles a template in the same environment (the same options, the
``tojson`` filter, ``raise_exception`` and ``strftime_now``, the ``{% generation %}`` tag)
and renders it with the same variables (the tokenizer's special tokens, then the caller's
keyword arguments, then ``messages``, ``tools``, ``documents`` and ``add_generation_prompt``),
so the text is the same (``tests/data/test_chat_template.py`` compares it with
``apply_chat_template`` on every shipped template). Each rendering counts its steps: every
loop iteration, every item of a ``range``, every call (``CALL_STEPS``; a macro recursing is
calls), every item a ``*`` repeats and every machine word of a ``**``'s integer result; past ``MAX_STEPS`` plus ``STEPS_PER_MESSAGE`` per message it stops
with ``TemplateTooLargeError``. The count is the rendering's own (a context variable), so
renders in several threads are each bounded, with no timer or signal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from eagle_train.errors import UserError

# A real template takes one or two steps per message (the shipped ones, measured); two nested
# range(100000) loops are refused within a tenth of a second. A call costs CALL_STEPS: a macro
# call takes some 100 times a loop iteration's time, so the budget bounds time either way.
MAX_STEPS = 200_000
STEPS_PER_MESSAGE = 1_000
CALL_STEPS = 10
_COUNTED = "eagle_train_counted"  # the filter every {% for %} iterates through


class TemplateTooLargeError(UserError, RuntimeError):
    """A chat template that takes more than its step budget (or recurses too deep) to render
    one conversation: a fault of the template, not of one record, so it stops the command."""


class TemplateMissingError(UserError, ValueError):
    """A tokenizer without a chat template where one is rendered."""


class _Render:
    """One rendering's state: its steps left, and the ``{% generation %}`` spans."""

    def __init__(self, steps: int, source: str, num_messages: int) -> None:
        self.left = steps
        self.budget = steps
        self.source = source
        self.num_messages = num_messages
        self.blocks: list[str] | None = None
        self.spans: list[tuple[int, int]] = []

    def step(self, n: int = 1) -> None:
        self.left -= n
        if self.left < 0:
            raise TemplateTooLargeError(
                f"{self.source}: the chat template takes over {self.budget:,} steps (loop "
                f"iterations, range items, calls) to render a conversation of "
                f"{self.num_messages} messages; at most {MAX_STEPS:,} + {STEPS_PER_MESSAGE:,} "
                "per message are allowed (a loop too large?): fix the template"
            )


_CURRENT: ContextVar[_Render | None] = ContextVar("eagle_train_render", default=None)


def _step(n: int = 1) -> None:
    render = _CURRENT.get()
    if render is not None:
        render.step(n)


def _counted(items: Iterable[Any]) -> Iterator[Any]:
    for item in items:
        _step()
        yield item


def _counted_range(*args: int) -> range:
    items = safe_range(*args)  # the sandbox's own limit, 100,000 items
    _step(len(items))
    return items


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}``: records the span of what it encloses in
    the rendered text, as transformers' ``AssistantTracker`` does."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation(self, caller: Any) -> str:
        text = caller()
        render = _CURRENT.get()
        if render is not None and render.blocks is not None:
            start = sum(len(b) for b in render.blocks)
            render.spans.append((start, start + len(text)))
        return str(text)


class _BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment, with every loop iteration, range item, call
    and repeated item counted against the current rendering's budget."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, "jinja2.ext.loopcontrols"],
        )
        self.filters["tojson"] = _tojson
        self.filters[_COUNTED] = _counted
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["range"] = _counted_range

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):  # iterate every {% for %} through _counted
            loop.iter = nodes.Filter(loop.iter, _COUNTED, [], [], None, None, lineno=loop.lineno)
        return tree

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _step(CALL_STEPS)
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":  # "x" * n, [..] * n: count the items made
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int):
                    _step(max(0, len(seq) * n))
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            _step(right * abs(left).bit_length() // 64)  # the result's machine words
        return super().call_binop(context, operator, left, right)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson: no HTML escaping, and its options exposed
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


_ENVIRONMENT = _BudgetedEnvironment()


@lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    return _ENVIRONMENT.from_string(template)


def render_chat(
    template: str,
    messages: list[Any],
    variables: dict[str, Any],
    *,
    add_generation_prompt: bool = False,
    source: str = "chat template",
    spans: list[tuple[int, int]] | None = None,
) -> str:
    """``template`` rendered for ``messages`` with ``variables`` (transformers passes the
    tokenizer's ``special_tokens_map`` updated with ``apply_chat_template``'s keyword
    arguments), within the step budget. ``spans``, when given, receives the character spans
    ``{% generation %}`` blocks enclose. Raises ``TemplateTooLargeError`` naming ``source``
    past the budget; a template's own error is a ``jinja2.TemplateError`` as in
    transformers."""
    compiled = _compiled(template)
    budget = MAX_STEPS + STEPS_PER_MESSAGE * len(messages)
    render = _Render(budget, source, len(messages))
    token = _CURRENT.set(render)
    args = {
        **variables,
        "messages": messages,
        "tools": None,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
    }
    try:
        if spans is None:
            return str(compiled.render(**args))
        render.blocks = []
        for block in compiled.generate(**args):
            render.blocks.append(block)
        spans.extend(render.spans)
        return "".join(render.blocks)
    except RecursionError:
        raise TemplateTooLargeError(
            f"{source}: the chat template recurses too deep to render a conversation of "
            f"{len(messages)} messages: fix the template"
        ) from None
    finally:
        _CURRENT.reset(token)


def tokenizer_template(tokenizer: Any, source: str) -> str:
    """The chat template ``apply_chat_template`` renders by default: the tokenizer's, or its
    ``default`` one of several named templates."""
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        raise TemplateMissingError(f"{source}: the tokenizer has no chat template")
    return str(template)


def chat_token_ids(
    tokenizer: Any,
    messages: list[Any],
    *,
    add_generation_prompt: bool,
    source: str,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """What ``tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
    **template_kwargs)["input_ids"]`` returns, rendered within the step budget: the
    tokenizer's template rendered, then tokenized without special tokens."""
    text = render_chat(
        tokenizer_template(tokenizer, source),
        messages,
        {**tokenizer.special_tokens_map, **(template_kwargs or {})},
        add_generation_prompt=add_generation_prompt,
        source=source,
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
