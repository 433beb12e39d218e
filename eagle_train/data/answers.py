"""A generated assistant turn back into the message fields the chat template reads.

Regeneration keeps going from the target's own answers: each generated turn becomes an
assistant message that the template renders back as exactly the generated text (then the
training row is the prompt plus what the target wrote, and later prompts hold that turn as the
template writes history). Tried in order, the first the template writes back as the generated
text wins:

1. the text as the content: ChatML, Llama, Mistral, and Qwen3 (whose template reads a think
   block out of the content);
2. split by the template's own layout of a turn with reasoning, found by rendering markers in
   place of the reasoning and the content: harmony writes
   ``<|channel|>analysis<|message|>`` reasoning ``<|end|><|start|>assistant<|channel|>final``
   ``<|message|>`` content, and refuses channel tags inside the content itself;
3. split by its layout of a turn without reasoning (harmony: ``<|channel|>final<|message|>``).

When none writes back (a template that trims the content, a harmony tool call, a turn cut at
the token limit), the text stays the content, as before.
"""

from __future__ import annotations

from eagle_train.data.chat import MARKER, ChatRenderer
from eagle_train.data.errors import DataError
from eagle_train.data.messages import Message

REASONING_MARKER = "\x00REASONING\x00"


def answer_message(
    renderer: ChatRenderer, history: list[Message], text: str, where: str
) -> Message:
    """The assistant message after ``history`` whose turn the template writes as ``text``."""
    plain: Message = {"role": "assistant", "content": text}
    for message in [plain, *_layout_splits(renderer, history, text, where)]:
        if _written(renderer, history, message, where).startswith(text):
            return message
    return plain


def _written(renderer: ChatRenderer, history: list[Message], message: Message, where: str) -> str:
    """What the target generates for ``message`` after ``history``, as the template writes it;
    ``"\\x00"`` (matching no generated text) when the template refuses the message."""
    try:
        return renderer.served_turn([*history, message], len(history), where)[1]
    except DataError:
        return "\x00"


def _layout_splits(
    renderer: ChatRenderer, history: list[Message], text: str, where: str
) -> list[Message]:
    splits: list[Message] = []
    reasoned: Message = {"role": "assistant", "content": MARKER}
    reasoned["reasoning_content"] = reasoned["thinking"] = REASONING_MARKER
    layout = _written(renderer, history, reasoned, where)
    head, found, rest = layout.partition(REASONING_MARKER)
    middle, found_content, _ = rest.partition(MARKER)
    if found and found_content and middle and text.startswith(head):
        cut = text.find(middle, len(head))
        if cut >= 0:
            reasoning = text[len(head) : cut]
            splits.append(
                {
                    "role": "assistant",
                    "content": text[cut + len(middle) :],
                    "reasoning_content": reasoning,
                    "thinking": reasoning,
                }
            )
    layout = _written(renderer, history, {"role": "assistant", "content": MARKER}, where)
    head, found, _ = layout.partition(MARKER)
    if found and head and text.startswith(head):
        splits.append({"role": "assistant", "content": text[len(head) :]})
    return splits
