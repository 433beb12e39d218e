"""Config of the ``prepare-data`` step (every default lives here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from eagle_train.config import StrictModel


class RegenerateConfig(StrictModel):
    """Replace every assistant turn with the target's own response (docs/data-flow.md)."""

    enabled: bool = False
    """Replace every assistant turn with the target's own answer, so the draft learns what the
    target writes (docs/data.md)."""
    model: Path | None = None
    """The target model directory; None: the tokenizer path (usually the model directory)."""
    backend: Literal["auto", "vllm", "transformers"] = "auto"
    """'vllm' (fast, continuous batching), 'transformers' (no vLLM needed), or 'auto' (vLLM
    when importable)."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """The target's dtype while regenerating (explicit, because vLLM's 'auto' silently turns
    fp32 checkpoints into bf16)."""
    max_new_tokens: int = Field(default=1024, gt=0)
    """Tokens generated per assistant turn at most (tokens)."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature of the answers (0: greedy)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling's probability mass, when sampling (1: off)."""
    seed: int = 0
    """Sampling seed of the answers (each request's derived from it)."""
    batch_size: int = Field(default=256, gt=0)
    """Conversations handed to the engine together (their turn-i prompts form one stream it
    batches continuously); finished ones are written after each such group."""
    output_path: Path | None = None
    """Regenerated records (OpenAI JSONL); None -> "<output_dir>.regenerated.jsonl"."""
    resume: bool = True
    """Keep records already in output_path (by id) and generate only the rest."""
    max_model_len: int | None = Field(default=None, gt=0)
    """Prompt + response token limit; None -> max_length of the prepared data. A prompt that
    does not fit is a failed record; a response is cut where it reaches the limit."""
    answer_trailing_user: bool = True
    """A conversation whose last message is a user turn gets a generated answer appended."""
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0)
    """vLLM's KV cache and its concurrency (sequences scheduled at once), sized together so that
    every running request fits whole and none is preempted: None for both -> on CPU
    CPU_MAX_NUM_SEQS and a cache that holds them, on GPU vLLM's sizing; one set -> the other
    follows (eagle_train.engine.preemption_free_size)."""
    max_num_seqs: int | None = Field(default=None, gt=0)
    """vLLM's concurrency (sequences scheduled at once); sized with kv_cache_memory_bytes (see
    there)."""
    data_parallel_size: int = Field(default=1, ge=1)
    """Engines that each hold the whole target, one per GPU group (prompts split between them;
    the output equals one engine's)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs one vLLM engine is split over (tensor parallel), for a target that does not fit on
    one; uses data_parallel_size x tensor_parallel_size GPUs."""


class VocabConfig(StrictModel):
    """The supervised-token counts every prepared dataset carries (the trainer builds a
    draft vocabulary of the draft's configured size from them)."""

    target_vocab_size: int | None = Field(default=None, gt=0)
    """The target's vocabulary size V (the length of the token counts); None: the model's
    config.json, else len(tokenizer)."""


class HubDataset(StrictModel):
    """A dataset read with ``datasets.load_dataset(name, config, split=..., streaming=...)``:
    a hub id (offline: already in the datasets cache) or a local dataset folder."""

    name: str
    """A hub dataset id (offline: already in the datasets cache) or a local dataset folder."""
    config: str | None = None
    """The dataset's configuration name (None: its default)."""
    split: str = "train"
    """The split to read."""
    streaming: bool = False
    """Read rows lazily (no full download or cache copy first): for large sets."""

    @property
    def label(self) -> str:
        """How records of this dataset are named in errors and ids."""
        return f"{self.name}{f'[{self.config}]' if self.config else ''}/{self.split}"


class SynthesizeConfig(StrictModel):
    """User prompts sampled from the target itself (no dataset): see ``synthesize.py``."""

    enabled: bool = False
    """Sample user prompts from the target itself (no dataset needed; needs regenerate.enabled
    for the answers)."""
    num_prompts: int = Field(default=256, gt=0)
    """Prompts to keep (the filters drop some of those sampled)."""
    temperature: float = Field(default=1.0, gt=0.0)
    """Sampling temperature of the user turns; every request gets its own seed (seed + request
    index)."""
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    """Nucleus sampling's probability mass of the user turns."""
    seed: int = 0
    """Sampling seed (request r uses seed + r)."""
    max_new_tokens: int = Field(default=96, gt=0)
    """Tokens per sampled user turn at most; a turn cut there is rejected (tokens)."""
    min_words: int = Field(default=3, ge=1)
    """A kept prompt has at least this many words."""
    max_chars: int = Field(default=400, gt=0)
    """A kept prompt has at most this many characters."""
    batch_size: int = Field(default=64, gt=0)
    """Requests generated together; generation stops once num_prompts are kept or after
    max_requests requests."""
    max_requests: int | None = Field(default=None, gt=0)
    """Stop sampling after this many requests (None: 4 x num_prompts)."""
    system: str | None = None
    """The system message the opening is rendered with (None: the template's own default)."""
    stems: Literal["builtin"] | Path | None = None
    """Task stems the user turn starts with, for diverse prompts: request r starts with stem r
    mod len (the target writes the rest). "builtin": the package's list (stems.py: the task
    types of chat benchmarks, writing to coding); a path: a text file, one stem per line;
    None: the user turn starts empty."""
    follow_ups: Literal["builtin"] | Path | None = None
    """A second user turn for every kept prompt, drawn (seeded) from a list of follow-up
    requests; regeneration then answers both turns. "builtin": the package's list (stems.py:
    rework the first answer, expand it, ...); a path: one request per line; None: single-turn
    conversations."""
    output_path: Path | None = None
    """Where the prompts are written, as OpenAI JSONL; None: '<output_dir>.prompts.jsonl'."""


class PrepareDataConfig(StrictModel):
    inputs: list[Path] = []
    """Local inputs: OpenAI or ShareGPT JSONL, parquet, arrow, saved dataset directories."""
    datasets: list[HubDataset] = []
    """Datasets read with datasets.load_dataset, by hub id or local folder."""
    synthesize: SynthesizeConfig = SynthesizeConfig()
    """User prompts sampled from the target itself, when there is no dataset."""
    output_dir: Path
    """Where the prepared dataset is written (rows, meta.json, token counts)."""
    tokenizer: Path
    """An HF tokenizer directory, or the target model directory (which holds its tokenizer)."""
    chat_template: Path | None = None
    """A .jinja file that replaces the tokenizer's chat template."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra template variables for every rendering, as at serving time (e.g. enable_thinking).
    """
    max_length: int = Field(default=2048, gt=0)
    """Tokens per prepared row at most: longer conversations are cut there (tokens)."""
    on_bad_record: Literal["error", "skip"] = "error"
    """A malformed record: 'error' stops with its file and line; 'skip' counts it and goes on.
    """
    limit: int | None = Field(default=None, gt=0)
    """Read at most this many records (valid or not) from the inputs, in order."""
    overwrite: bool = False
    """Replace an existing output_dir (otherwise an existing one is an error)."""
    regenerate: RegenerateConfig = RegenerateConfig()
    """The target rewrites the assistant turns."""
    vocab: VocabConfig = VocabConfig()
    """The supervised-token counts the trainer builds the draft vocabulary from."""

    @model_validator(mode="after")
    def _some_input(self) -> PrepareDataConfig:
        if not (self.inputs or self.datasets or self.synthesize.enabled):
            raise ValueError("give inputs, datasets, or synthesize.enabled=true")
        if self.synthesize.enabled and not self.regenerate.enabled:
            raise ValueError("synthesize.enabled needs regenerate.enabled (prompts need answers)")
        return self
