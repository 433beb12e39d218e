"""Golden loss masks for the published chat templates of the model families (tests/assets/).

Every expected text and supervised piece below is written by hand from what each template
prints (read the .jinja next to it), not by calling the renderer: the rows a conversation
trains as, and the exact text of each span the target generates at serving time.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from data_fixtures import build_tokenizer

from eagle_train.data import ChatRenderer
from eagle_train.data.answers import answer_message
from eagle_train.data.messages import parse_turns

TEMPLATES = Path(__file__).parents[1] / "assets" / "chat_templates"
FAMILY_TOKENS = ["<s>", "</s>", "[INST]", "[/INST]", "<think>", "</think>"]
FAMILY_TOKENS += ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
FAMILY_TOKENS += ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>"]
FAMILY_TOKENS += ["<|constrain|>"]

CHAT = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6."},
]
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "22C"},
    {"role": "assistant", "content": "It is 22C."},
]
REASONED = [*CHAT[:3], {**CHAT[3], "reasoning_content": "3+3 is 6."}]

SMOL_SYS = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)
LLAMA_SYS = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
    "December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|>"
)
LLAMA_ASSISTANT = "<|start_header_id|>assistant<|end_header_id|>\n\n"
THINK = "<think>\n\n</think>\n\n"
Q_USER1 = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
Q_USER2 = "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
Q_ASSISTANT = "<|im_start|>assistant\n"
Q_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
Q_TOOL_PROMPT = (
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    f"{Q_ASSISTANT}{Q_CALL}<|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
)

# gpt-oss (harmony). The template has no date variable: "Current date:" is strftime_now, which
# the cases pin through the template variables (a render variable shadows the global).
JAN_1 = {"strftime_now": lambda fmt: date(2025, 1, 1).strftime(fmt)}
H_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
H_SYS = (
    "<|start|>system<|message|>{identity}\nKnowledge cutoff: 2024-06\nCurrent date: 2025-01-01"
    "\n\nReasoning: {effort}\n\n# Valid channels: analysis, commentary, final. Channel must "
    "be included for every message.<|end|>"
)
H_USER1 = "<|start|>user<|message|>What is 2+2?<|end|>"
H_USER2 = "<|start|>user<|message|>And 3+3?<|end|>"
H_ASSISTANT = "<|start|>assistant"  # the generation prompt
H_FINAL = "<|channel|>final<|message|>"
H_ROW1 = H_SYS.format(identity=H_IDENTITY, effort="medium") + H_USER1 + H_ASSISTANT
H_CALL = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
H_TOOL_PROMPT = (
    H_SYS.format(identity=H_IDENTITY, effort="medium")
    + "<|start|>user<|message|>Weather in Paris?<|end|>"
    + H_ASSISTANT
)
H_TOOL_RESULT = (
    '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"22C"<|end|>'
)
# Reasoning given as the inputs carry it (``thinking``, ``reasoning_content``), read by the
# project's own parser, which hands the template the ``thinking`` key it renders.
H_REASONED = parse_turns(
    [CHAT[0], {**CHAT[1], "thinking": "2+2 is 4."}, CHAT[2], REASONED[3]], "messages", "golden"
)
H_TOOL_REASONED = parse_turns(
    [
        TOOL_CHAT[0],
        {**TOOL_CHAT[1], "reasoning_content": "Need the weather."},
        TOOL_CHAT[2],
        {**TOOL_CHAT[3], "thinking": "22C is warm."},
    ],
    "messages",
    "golden",
)

# case: (template, messages, chat_template_kwargs, [(row text, [supervised pieces])])
CASES = {
    "smollm2_default_system": (
        "smollm2.jinja",
        CHAT,
        {},
        [
            (
                SMOL_SYS + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
                "4.<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
                "6.<|im_end|>\n",
                ["4.<|im_end|>", "6.<|im_end|>"],
            )
        ],
    ),
    "llama3_date_kwarg": (
        "llama3.2.jinja",
        CHAT,
        {"date_string": "01 Jan 2025"},
        [
            (
                LLAMA_SYS + "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                f"{LLAMA_ASSISTANT}4.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                f"And 3+3?<|eot_id|>{LLAMA_ASSISTANT}6.<|eot_id|>",
                ["4.<|eot_id|>", "6.<|eot_id|>"],
            )
        ],
    ),
    "llama3_tool_call": (
        "llama3.2.jinja",
        TOOL_CHAT,
        {"date_string": "01 Jan 2025"},
        [
            (
                LLAMA_SYS + "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?"
                f'<|eot_id|>{LLAMA_ASSISTANT}{{"name": "get_weather", "parameters": '
                '{"city": "Paris"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n'
                f'"22C"<|eot_id|>{LLAMA_ASSISTANT}It is 22C.<|eot_id|>',
                [
                    '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
                    "It is 22C.<|eot_id|>",
                ],
            )
        ],
    ),
    "qwen3_thinking": (
        "qwen3.jinja",
        REASONED,
        {},
        [
            (
                f"{Q_USER1}{Q_ASSISTANT}{THINK}4.<|im_end|>\n",
                [f"{THINK}4.<|im_end|>"],
            ),
            (
                f"{Q_USER1}{Q_ASSISTANT}4.<|im_end|>\n{Q_USER2}{Q_ASSISTANT}"
                "<think>\n3+3 is 6.\n</think>\n\n6.<|im_end|>\n",
                ["<think>\n3+3 is 6.\n</think>\n\n6.<|im_end|>"],
            ),
        ],
    ),
    "qwen3_no_thinking": (
        "qwen3.jinja",
        REASONED,
        {"enable_thinking": False},
        [
            (f"{Q_USER1}{Q_ASSISTANT}{THINK}4.<|im_end|>\n", ["4.<|im_end|>"]),
            (
                f"{Q_USER1}{Q_ASSISTANT}4.<|im_end|>\n{Q_USER2}{Q_ASSISTANT}{THINK}6.<|im_end|>\n",
                ["6.<|im_end|>"],
            ),
        ],
    ),
    "qwen3_tool_call": (
        "qwen3.jinja",
        TOOL_CHAT,
        {},
        [
            (
                f"<|im_start|>user\nWeather in Paris?<|im_end|>\n{Q_ASSISTANT}{THINK}{Q_CALL}"
                "<|im_end|>\n",
                [f"{THINK}{Q_CALL}<|im_end|>"],
            ),
            (
                f"{Q_TOOL_PROMPT}{Q_ASSISTANT}{THINK}It is 22C.<|im_end|>\n",
                [f"{THINK}It is 22C.<|im_end|>"],
            ),
        ],
    ),
    "mistral": (
        "mistral_nemo.jinja",
        CHAT,
        {},
        [("<s>[INST]What is 2+2?[/INST]4.</s>[INST]And 3+3?[/INST]6.</s>", ["4.</s>", "6.</s>"])],
    ),
    "mistral_system_moves_to_last_user": (
        "mistral_nemo.jinja",
        [{"role": "system", "content": "Be brief."}, *CHAT],
        {},
        [
            ("<s>[INST]Be brief.\n\nWhat is 2+2?[/INST]4.</s>", ["4.</s>"]),
            (
                "<s>[INST]What is 2+2?[/INST]4.</s>[INST]Be brief.\n\nAnd 3+3?[/INST]6.</s>",
                ["6.</s>"],
            ),
        ],
    ),
    # Earlier final messages end in <|end|>, the last one in <|return|>: never one row.
    "gpt_oss_chat": (
        "gpt_oss.jinja",
        CHAT,
        JAN_1,
        [
            (f"{H_ROW1}{H_FINAL}4.<|return|>", [f"{H_FINAL}4.<|return|>"]),
            (
                f"{H_ROW1}{H_FINAL}4.<|end|>{H_USER2}{H_ASSISTANT}{H_FINAL}6.<|return|>",
                [f"{H_FINAL}6.<|return|>"],
            ),
        ],
    ),
    # A system (or developer) message becomes harmony's developer message under
    # "# Instructions"; the system message proper is the template's own (model_identity).
    "gpt_oss_developer_message": (
        "gpt_oss.jinja",
        [{"role": "system", "content": "Be brief."}, *CHAT[:2]],
        {**JAN_1, "model_identity": "You are Tiny."},
        [
            (
                H_SYS.format(identity="You are Tiny.", effort="medium")
                + "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
                + f"{H_USER1}{H_ASSISTANT}{H_FINAL}4.<|return|>",
                [f"{H_FINAL}4.<|return|>"],
            )
        ],
    ),
    # The last turn's analysis is generated (supervised); earlier turns' analysis is dropped.
    "gpt_oss_thinking": (
        "gpt_oss.jinja",
        H_REASONED,
        {**JAN_1, "reasoning_effort": "high"},
        [
            (
                H_SYS.format(identity=H_IDENTITY, effort="high")
                + f"{H_USER1}{H_ASSISTANT}<|channel|>analysis"
                f"<|message|>2+2 is 4.<|end|>{H_ASSISTANT}{H_FINAL}4.<|return|>",
                [
                    f"<|channel|>analysis<|message|>2+2 is 4.<|end|>{H_ASSISTANT}{H_FINAL}4.<|return|>"
                ],
            ),
            (
                H_SYS.format(identity=H_IDENTITY, effort="high")
                + f"{H_USER1}{H_ASSISTANT}{H_FINAL}4.<|end|>{H_USER2}"
                f"{H_ASSISTANT}<|channel|>analysis<|message|>3+3 is 6.<|end|>{H_ASSISTANT}"
                f"{H_FINAL}6.<|return|>",
                [
                    f"<|channel|>analysis<|message|>3+3 is 6.<|end|>{H_ASSISTANT}{H_FINAL}6.<|return|>"
                ],
            ),
        ],
    ),
    # A tool call without analysis renders the same before and after the final answer: one row.
    "gpt_oss_tool_call": (
        "gpt_oss.jinja",
        TOOL_CHAT,
        JAN_1,
        [
            (
                f"{H_TOOL_PROMPT}{H_CALL}{H_TOOL_RESULT}{H_ASSISTANT}{H_FINAL}It is 22C.<|return|>",
                [H_CALL, f"{H_FINAL}It is 22C.<|return|>"],
            )
        ],
    ),
    # The tool call's analysis stays in the prompt until a final message exists (the template
    # drops it then): the final answer's row is the prompt the target saw, with that analysis,
    # and the answer from its own analysis on (what follows the generation prompt).
    "gpt_oss_tool_call_thinking": (
        "gpt_oss.jinja",
        H_TOOL_REASONED,
        JAN_1,
        [
            (
                f"{H_TOOL_PROMPT}<|channel|>analysis<|message|>Need the weather.<|end|>"
                f"{H_ASSISTANT}{H_CALL}",
                [f"<|channel|>analysis<|message|>Need the weather.<|end|>{H_ASSISTANT}{H_CALL}"],
            ),
            (
                f"{H_TOOL_PROMPT}<|channel|>analysis<|message|>Need the weather.<|end|>"
                f"{H_ASSISTANT}{H_CALL}{H_TOOL_RESULT}{H_ASSISTANT}<|channel|>analysis<|message|>"
                f"22C is warm.<|end|>{H_ASSISTANT}{H_FINAL}It is 22C.<|return|>",
                [
                    "<|channel|>analysis<|message|>22C is warm.<|end|>"
                    f"{H_ASSISTANT}{H_FINAL}It is 22C.<|return|>"
                ],
            ),
        ],
    ),
}


H_ANALYSIS = "<|channel|>analysis<|message|>3+3 is 6.<|end|>"
# A generated turn (regeneration) back into the fields each template reads: (template, text
# generated after the prompt of CHAT[:3], message, the supervised piece of its row: the text
# and the stop token the target ended it with).
GENERATED = {
    "gpt_oss_analysis_and_final": (
        "gpt_oss.jinja",
        f"{H_ANALYSIS}{H_ASSISTANT}{H_FINAL}6.",
        {
            "role": "assistant",
            "content": "6.",
            "reasoning_content": "3+3 is 6.",
            "thinking": "3+3 is 6.",
        },
        f"{H_ANALYSIS}{H_ASSISTANT}{H_FINAL}6.<|return|>",
    ),
    "gpt_oss_final_only": (
        "gpt_oss.jinja",
        f"{H_FINAL}6.",
        {"role": "assistant", "content": "6."},
        f"{H_FINAL}6.<|return|>",
    ),
    # Qwen3's template reads the think block out of the content: the text stays the content.
    "qwen3_think_block": (
        "qwen3.jinja",
        "<think>\n3+3 is 6.\n</think>\n\n6.",
        {"role": "assistant", "content": "<think>\n3+3 is 6.\n</think>\n\n6."},
        "<think>\n3+3 is 6.\n</think>\n\n6.<|im_end|>",
    ),
    "smollm2": ("smollm2.jinja", "6.", {"role": "assistant", "content": "6."}, "6.<|im_end|>"),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("family_tok"))
    tok.add_tokens(FAMILY_TOKENS, special_tokens=True)
    return tok


def _renderer(tokenizer, template: str, kwargs: dict) -> ChatRenderer:
    if template.startswith("mistral"):
        tokenizer.bos_token, tokenizer.eos_token = "<s>", "</s>"
    else:
        tokenizer.bos_token, tokenizer.eos_token = "<|begin_of_text|>", "<|end_of_text|>"
    return ChatRenderer(tokenizer, (TEMPLATES / template).read_text(), kwargs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_family_rows_and_spans(tokenizer, case):
    template, messages, kwargs, expected = CASES[case]
    rows = _renderer(tokenizer, template, kwargs).training_rows(messages, "golden.jsonl:1")
    assert [text for text, _ in rows] == [text for text, _ in expected]
    for (text, spans), (_, pieces) in zip(rows, expected, strict=True):
        assert [text[s:e] for s, e in spans] == pieces


@pytest.mark.parametrize("case", sorted(CASES))
def test_family_token_masks(tokenizer, case):
    template, messages, kwargs, expected = CASES[case]
    renderer = _renderer(tokenizer, template, kwargs)
    rows = renderer.tokenize_rows(messages, 4096, "golden.jsonl:1")
    assert len(rows) == len(expected)
    for row, (text, pieces) in zip(rows, expected, strict=True):
        decoded = [
            tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            for run in _masked_runs(row.input_ids, row.loss_mask)
        ]
        assert decoded == pieces
        assert tokenizer.decode(row.input_ids, skip_special_tokens=False) == text


def _masked_runs(ids, mask):
    runs, current = [], []
    for token, m in zip(ids, mask, strict=True):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


@pytest.mark.parametrize("case", sorted(GENERATED))
def test_generated_turn_trains_as_generated(tokenizer, case):
    template, text, message, piece = GENERATED[case]
    renderer = _renderer(tokenizer, template, JAN_1)
    answer = answer_message(renderer, CHAT[:3], text, "regen.jsonl:1")
    assert answer == message
    text_of_row, spans = renderer.training_rows([*CHAT[:3], answer], "regen.jsonl:1")[-1]
    assert [text_of_row[s:e] for s, e in spans][-1] == piece
