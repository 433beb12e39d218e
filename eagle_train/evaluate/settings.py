"""How acceptance length is measured in vLLM: one schema, every default written once.

``AcceptanceSettings`` is the measurement (prompts, lengths, engine sizes). ``EvalSettings`` is
the ``eval-acceptance`` config (the measurement plus target, drafters and output), and the run
config nests ``TrainAcceptance`` (the measurement plus how often) as ``train.acceptance``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from eagle_train.config import StrictModel

# Upper edges of the default context-length buckets: <1k, 1-2k, 2-4k, ..., >=128k tokens.
DEFAULT_BUCKETS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


class Sampling(StrictModel):
    """How every request is decoded: greedy (temperature 0, the default) or sampled as a
    server samples (vLLM verifies the drafts by rejection sampling). Each request is seeded
    with ``request_seed(seed, prompt id, turn)`` (``evaluate/sampling.py``), so a rerun draws
    the same tokens. The same settings drive train.acceptance's probe and the offline
    ``sim_accept_len_sampled`` of validation."""

    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature of every request: 0 decodes greedily (the default and what the
    results pages report); above 0 vLLM verifies the drafts by rejection sampling."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling's probability mass, when sampling (1: off)."""
    top_k: int | None = Field(default=None, ge=1)
    """Sample among the k most likely tokens, when sampling (None: off)."""
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """The run's sampling seed, each request's derived from it with its prompt id and turn;
    refused at temperature 0 like top_p and top_k."""

    @model_validator(mode="after")
    def _sampled_only(self) -> Sampling:
        if self.temperature == 0:
            off = {"top_p": self.top_p == 1.0, "top_k": self.top_k is None, "seed": self.seed == 0}
            for key, unset in off.items():
                if not unset:
                    raise ValueError(
                        f"{key} applies only when sampling: set temperature > 0 (temperature "
                        "0 is greedy decoding, which takes the argmax and samples nothing)"
                    )
        return self


class AcceptanceSettings(Sampling):
    prompts: str = "mt_bench"
    """The prompts: 'mt_bench' (the 80 MT-Bench questions shipped with the package, two turns
    each) or a JSONL file of prompts or chat messages."""
    num_prompts: int | None = Field(default=None, ge=1)
    """Measure the first N prompts (None: all)."""
    turns: Literal[1, 2] = 2
    """1: first turns only; 2: both turns (turn 2's context holds the target alone's first
    answer)."""
    max_new_tokens: int = Field(default=256, ge=1)
    """New tokens generated per request (tokens)."""
    num_speculative_tokens: int | None = Field(default=None, ge=1)
    """Tokens drafted per step, K (None: the export's own, the K it was trained for)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """vLLM's context limit per request (tokens). None: the longest request of the prompt set
    plus max_new_tokens and K, within the target's own limit (evaluate/engine_choice.py)."""
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0)
    """vLLM's KV cache size (bytes). None: vLLM sizes the cache on GPU; on CPU one
    max_model_len request of the target, twice over, at least the engine's default
    (evaluate/engine_choice.py)."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token up to max_new_tokens (every request then
    has the same length)."""


class EvalSettings(AcceptanceSettings):
    """The ``eval-acceptance`` config."""

    target: Path
    """The target model directory vLLM serves (--target)."""
    drafters: list[Path] = Field(min_length=1)
    """Drafter directories in any layout vLLM serves (export-draft output, speculators',
    SafeAILab's, z-lab's; docs/serving-and-evaluation.md), or 'ngram' for vLLM's n-gram
    proposer; paired statistics compare each with the first (--draft, repeatable)."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """The target's and the drafters' dtype in vLLM (explicit: vLLM's "auto" would pick
    the checkpoint's)."""
    baseline: bool = True
    """Also run the target alone (needed for the speedup and for turn 2's context)."""
    output_dir: Path = Path("runs/eval")
    """Where the per-prompt records, summary.json/.md and acceptance.png go (--out)."""
    chat_template_kwargs: dict[str, Any] = {}
    """Template variables for the prompts, as the server runs them (e.g. enable_thinking)."""
    round_size: int = Field(default=8, ge=1)
    """Requests per measurement round: the target alone and each drafter take turns round by
    round (each engine in its own process), so a load change hits both sides of a round."""
    interleave: bool = True
    """False: acceptance only - the target alone runs once (turn 2's context, greedy equality),
    then each drafter once; no interleaved speedup (about half the serving)."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    """vLLM's GPU memory share per engine; None: 0.9 split between the engines alive at once."""
    beside_greedy: bool = True
    """Sampled runs (temperature > 0): every engine also serves the same requests greedily (a
    second pass, about twice the serving), and the report puts the two side by side."""
    allow_other_target: bool = False
    """Measure a drafter whose recorded target (the verifier it names; the architecture,
    layers and hidden size its provenance records) differs from --target; false: refused in
    one line before any engine starts."""

    context_buckets: list[int] = Field(default_factory=lambda: list(DEFAULT_BUCKETS), min_length=1)
    """Upper edges of the context-length buckets (tokens in the sequence when a step's drafts
    were made) the report splits acceptance by: the default is <1k, 1-2k, 2-4k, ..., >=128k."""

    @model_validator(mode="after")
    def _each_drafter_once(self) -> EvalSettings:
        """A drafter named twice (also through a symlink) would be measured twice and pooled
        into one entry: refused, naming it."""
        seen: dict[str, Path] = {}
        for drafter in self.drafters:
            key = str(drafter) if str(drafter) == "ngram" else str(drafter.expanduser().resolve())
            if key in seen:
                same = "" if seen[key] == drafter else f" (as {seen[key]} and {drafter})"
                raise ValueError(f"drafter {drafter} is named twice{same}: name each drafter once")
            seen[key] = drafter
        return self

    @model_validator(mode="after")
    def _beside_greedy_when_sampling(self) -> EvalSettings:
        if (
            self.temperature == 0
            and self.beside_greedy
            and "beside_greedy" in self.model_fields_set
        ):
            raise ValueError(
                "beside_greedy=true applies only when sampling: set temperature > 0 (a greedy "
                "run is the greedy figure already)"
            )
        return self

    @model_validator(mode="after")
    def _increasing_buckets(self) -> EvalSettings:
        edges = self.context_buckets
        if edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            raise ValueError(
                f"context_buckets must be positive and strictly increasing, got {edges}"
            )
        return self

    def greedy(self) -> EvalSettings:
        """The same measurement decoded greedily (temperature 0, top_p, top_k and seed off)."""
        return self.model_copy(update=dict(temperature=0.0, top_p=1.0, top_k=None, seed=0))


class TrainAcceptance(AcceptanceSettings):
    """``train.acceptance``: every ``every`` steps (and at the end) the current draft is served
    next to the target (needs the vllm extra); the best checkpoint is kept under best/. Only
    first turns (turn 2 needs the target-alone answers, which the probe does not serve), and by
    default a small prompt set, so a measurement costs little training time."""

    every: int | None = Field(default=None, ge=1)
    """Serve the draft every this many training steps, and at the end (None: never)."""
    turns: Literal[1] = 1
    """First turns only (turn 2 needs the target-alone answers, which the probe does not
    serve)."""
    num_prompts: int | None = Field(default=16, ge=1)
    """Prompts per probe (a small set, so a measurement costs little training time)."""
