"""Config of the ``prepare-data`` step (every default lives here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from eagle_train.config import Seed, StrictModel, refuse_moved_key


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
    seed: Seed = 0
    # Conversations handed to the engine together (their turn-i prompts form one stream it
    # batches continuously); finished ones are written after each such group.
    batch_size: int = Field(default=256, gt=0)
    # Regenerated records (OpenAI JSONL); None -> "<output_dir>.regenerated.jsonl".
    output_path: Path | None = None
    # Keep records already in output_path (by id) and generate only the rest.
    resume: bool = True
    # Prompt + response token limit; None -> max_length of the prepared data. A prompt that
    # does not fit is a failed record; a response is cut where it reaches the limit.
    max_model_len: int | None = Field(default=None, gt=0)
    # A conversation whose last message is a user turn gets a generated answer appended.
    answer_trailing_user: bool = True
    # vLLM's KV cache and its concurrency (sequences scheduled at once), sized together so
    # that every running request fits whole and none is preempted: None for both -> on CPU
    # CPU_MAX_NUM_SEQS and a cache that holds them, on GPU vLLM's sizing; one set -> the
    # other follows (eagle_train.engine.preemption_free_size).
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, gt=0)
    # Several GPUs: engines that each hold the whole target, one per GPU (prompts split
    # between them; the output equals one engine's), and/or one engine tensor-parallel
    # over this many GPUs for a target that does not fit on one. Uses dp x tp GPUs.
    data_parallel_size: int = Field(default=1, ge=1)
    tensor_parallel_size: int = Field(default=1, ge=1)


class VocabConfig(StrictModel):
    """The supervised-token counts every prepared dataset carries (the trainer builds a
    draft vocabulary of the draft's configured size from them)."""

    # Target vocab size V (length of the counts); None -> the model's config.json, else
    # len(tokenizer).
    target_vocab_size: int | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _size_moved(cls, data: Any) -> Any:
        return refuse_moved_key(
            data,
            "draft_vocab_size",
            "vocab.draft_vocab_size moved to the train-draft run config as "
            "draft.draft_vocab_size (prepare-data now always writes the token counts the "
            "trainer builds the draft vocabulary from): remove it here",
        )


class HubDataset(StrictModel):
    """A dataset read with ``datasets.load_dataset(name, config, split=..., streaming=...)``:
    a hub id (offline: already in the datasets cache) or a local dataset folder."""

    name: str
    config: str | None = None
    split: str = "train"
    # Read rows lazily (no full download or cache copy first): for large sets.
    streaming: bool = False

    @property
    def label(self) -> str:
        """How records of this dataset are named in errors and ids."""
        return f"{self.name}{f'[{self.config}]' if self.config else ''}/{self.split}"


class SynthesizeConfig(StrictModel):
    """User prompts sampled from the target itself (no dataset): see ``synthesize.py``."""

    enabled: bool = False
    num_prompts: int = Field(default=256, gt=0)
    # Sampling of the user turn; every request gets its own seed (seed + request index).
    temperature: float = Field(default=1.0, gt=0.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    seed: Seed = 0
    max_new_tokens: int = Field(default=96, gt=0)
    # Kept prompts have this many words at least / characters at most.
    min_words: int = Field(default=3, ge=1)
    max_chars: int = Field(default=400, gt=0)
    # Requests generated together; generation stops once num_prompts are kept or after
    # max_requests requests.
    batch_size: int = Field(default=64, gt=0)
    max_requests: int | None = Field(default=None, gt=0)  # None -> 4 x num_prompts
    # The system message the opening is rendered with (None: the template's own default).
    system: str | None = None
    # Task stems the user turn starts with, for diverse prompts: request r starts with stem
    # r mod len (the target writes the rest). "builtin": the package's list (stems.py: the
    # task types of chat benchmarks, writing to coding); a path: a text file, one stem per
    # line; None: the user turn starts empty.
    stems: Literal["builtin"] | Path | None = None
    # A second user turn for every kept prompt, drawn (seeded) from a list of follow-up
    # requests; regeneration then answers both turns. "builtin": the package's list
    # (stems.py: rework the first answer, expand it, ...); a path: one request per line;
    # None: single-turn conversations.
    follow_ups: Literal["builtin"] | Path | None = None
    # Passage tasks instead of sampled user turns: a JSONL of conversations (e.g. an earlier
    # prepare-data's regenerated file); prompt k is passage task k mod len, a blank line and
    # the first assistant answer (of passage_min_words words at least) of the k-th
    # conversation there that has one, in file order. No sampling: the target then answers
    # a text it wrote itself, repeating its words (passages.py).
    passages: Path | None = None
    passage_tasks: Literal["builtin"] | Path = "builtin"
    passage_min_words: int = Field(default=30, ge=1)
    # Written as OpenAI JSONL (one user turn each); None -> "<output_dir>.prompts.jsonl".
    output_path: Path | None = None


class PrepareDataConfig(StrictModel):
    # Local inputs (JSONL, parquet, arrow, saved dataset dirs) and/or datasets by id.
    inputs: list[Path] = []
    datasets: list[HubDataset] = []
    synthesize: SynthesizeConfig = SynthesizeConfig()
    output_dir: Path
    # An HF tokenizer directory, or the target model directory (which holds its tokenizer).
    tokenizer: Path
    # A .jinja file that replaces the tokenizer's chat template.
    chat_template: Path | None = None
    # Extra template variables for every rendering, as at serving time (e.g. enable_thinking).
    chat_template_kwargs: dict[str, Any] = {}
    # at most 2**20 tokens: the byte limit of a record (64 per token) stays bounded
    max_length: int = Field(default=2048, gt=0, le=1 << 20)
    on_bad_record: Literal["error", "skip"] = "error"
    # Read at most this many records (valid or not) from the inputs, in order.
    limit: int | None = Field(default=None, gt=0)
    # Replace an existing output_dir (otherwise an existing one is an error).
    overwrite: bool = False
    regenerate: RegenerateConfig = RegenerateConfig()
    vocab: VocabConfig = VocabConfig()

    @model_validator(mode="after")
    def _some_input(self) -> PrepareDataConfig:
        if not (self.inputs or self.datasets or self.synthesize.enabled):
            raise ValueError("give inputs, datasets, or synthesize.enabled=true")
        if self.synthesize.enabled and not self.regenerate.enabled:
            raise ValueError("synthesize.enabled needs regenerate.enabled (prompts need answers)")
        return self
