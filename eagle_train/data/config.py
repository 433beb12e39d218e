"""Config of the ``prepare-data`` step (every default lives here)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from eagle_train.config import StrictModel


class RegenerateConfig(StrictModel):
    """Replace every assistant turn with the target's own response (docs/data-flow.md)."""

    enabled: bool = False
    # The target model directory; None -> the `tokenizer` path (usually the model directory).
    model: Path | None = None
    backend: Literal["auto", "vllm", "transformers"] = "auto"
    # Explicit, because vLLM's "auto" silently turns fp32 checkpoints into bf16.
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    max_new_tokens: int = Field(default=1024, gt=0)
    temperature: float = Field(default=0.0, ge=0.0)  # 0 -> greedy
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int = 0
    # Conversations generated together (their turn-i prompts form one generation batch).
    batch_size: int = Field(default=64, gt=0)
    # Regenerated records (OpenAI JSONL); None -> "<output_dir>.regenerated.jsonl".
    output_path: Path | None = None
    # Keep records already in output_path (by id) and generate only the rest.
    resume: bool = True
    # Prompt + response token limit; None -> max_length of the prepared data. A prompt that
    # does not fit is a failed record; a response is cut where it reaches the limit.
    max_model_len: int | None = Field(default=None, gt=0)
    # A conversation whose last message is a user turn gets a generated answer appended.
    answer_trailing_user: bool = True
    # vLLM KV-cache size; None -> the engine's default (eagle_train.engine.resolve_kv_cache_bytes).
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0)
    # Several GPUs: engines that each hold the whole target, one per GPU (prompts split
    # between them; the output equals one engine's), and/or one engine tensor-parallel
    # over this many GPUs for a target that does not fit on one. Uses dp x tp GPUs.
    data_parallel_size: int = Field(default=1, ge=1)
    tensor_parallel_size: int = Field(default=1, ge=1)


class VocabConfig(StrictModel):
    """Draft vocabulary mapping (EAGLE-3); none is built when draft_vocab_size is None."""

    draft_vocab_size: int | None = Field(default=None, gt=0)
    # Target vocab size V (length of t2d); None -> the model's config.json, else len(tokenizer).
    target_vocab_size: int | None = Field(default=None, gt=0)


class PrepareDataConfig(StrictModel):
    inputs: list[Path] = Field(min_length=1)
    output_dir: Path
    # An HF tokenizer directory, or the target model directory (which holds its tokenizer).
    tokenizer: Path
    # A .jinja file that replaces the tokenizer's chat template.
    chat_template: Path | None = None
    max_length: int = Field(default=2048, gt=0)
    on_bad_record: Literal["error", "skip"] = "error"
    # Read at most this many records (valid or not) from the inputs, in order.
    limit: int | None = Field(default=None, gt=0)
    # Replace an existing output_dir (otherwise an existing one is an error).
    overwrite: bool = False
    regenerate: RegenerateConfig = RegenerateConfig()
    vocab: VocabConfig = VocabConfig()
