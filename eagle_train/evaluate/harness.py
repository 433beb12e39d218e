"""The acceptance-length harness: the target alone and each drafter on the same prompts,
greedy or sampled (``sampling.py``: each request with its own seed), one request at a time, counters read as deltas around every request. The target
alone and the drafter take turns in rounds of requests (``rounds.py``), each engine alive in
its own process, so a load change on the machine cannot skew their speed ratio.

Turn 2 of a multi-turn prompt is asked with the target's own first answer in the context
(taken from the no-draft run; greedy speculative decoding would produce the same answer,
sampled decoding an answer from the same distribution).
Every drafter is read and checked against vLLM's contract before any engine starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from transformers import AutoTokenizer

from eagle_train.chat_template import chat_token_ids
from eagle_train.config import ConfigError
from eagle_train.engine import VllmEngine
from eagle_train.engine.remote import Remote
from eagle_train.engine.vllm_engine import (
    Measured,
    cuda_available,
    engine_starts_here,
    opens_numba,
)
from eagle_train.evaluate.drafter import DrafterInfo, inspect_drafter
from eagle_train.evaluate.engine_choice import RETOKENIZE_SLACK, EngineChoice, choose_engine
from eagle_train.evaluate.prompts import EvalPrompt, load_prompts
from eagle_train.evaluate.rounds import Round, interleave
from eagle_train.evaluate.sampling import request_seed, sampling_params
from eagle_train.evaluate.settings import EvalSettings
from eagle_train.evaluate.steps import decode_steps
from eagle_train.target_model import load_target_description
from eagle_train.target_model.location import from_pretrained

log = logging.getLogger(__name__)


@dataclass
class Request:
    prompt: EvalPrompt
    turn: int  # 1-based
    token_ids: list[int]


@dataclass
class EvalRun:
    settings: EvalSettings
    drafters: list[DrafterInfo]
    records: list[dict[str, Any]] = field(default_factory=list)
    rounds: dict[str, list[Round]] = field(default_factory=dict)  # per drafter
    # Sampled runs: per engine ("target" or the drafter), whether its warm-up request,
    # served twice with one seed, drew the same tokens both times.
    reproducible: dict[str, bool] = field(default_factory=dict)
    # Sampled runs with ``beside_greedy``: the same requests served greedily, in a pass of
    # their own (fresh engines), for the report's side-by-side table.
    greedy: EvalRun | None = None
    # The engine settings this run chose (engine_choice.py), printed in the report.
    engine: EngineChoice | None = None


def run_eval(settings: EvalSettings) -> EvalRun:
    """Every drafter at the settings' decoding; a sampled run with ``beside_greedy`` then
    serves the same prompts greedily too (``EvalRun.greedy``)."""
    run = _run_one(settings)
    if settings.temperature > 0 and settings.beside_greedy:
        log.info("beside_greedy: the same requests again, greedy")
        run.greedy = _run_one(settings.greedy())
    return run


def _run_one(settings: EvalSettings) -> EvalRun:
    if settings.turns == 2 and not settings.baseline:
        raise ConfigError(
            "turns=2: turn 2 is asked with the target's own first answer: keep the baseline"
        )
    target_config = load_target_description(settings.target, "--target")
    infos = [
        inspect_drafter(
            d,
            target_config,
            settings.num_speculative_tokens,
            settings.target,
            settings.allow_other_target,
        )
        for d in settings.drafters
    ]
    tokenizer = from_pretrained(AutoTokenizer, settings.target, "--target")
    prompts = load_prompts(settings.prompts, settings.num_prompts)
    kw = settings.chat_template_kwargs
    first = [Request(p, 1, render_turn(tokenizer, p, [], kw)) for p in prompts]
    second_bound = [
        len(render_turn(tokenizer, p, [""], kw)) + settings.max_new_tokens + RETOKENIZE_SLACK
        for p in prompts
        if settings.turns == 2 and len(p.turns) > 1
    ]
    engine = choose_engine(
        target_dir=settings.target,
        dtype=settings.dtype,
        max_position_embeddings=target_config.max_position_embeddings,
        longest_request=max([len(r.token_ids) for r in first] + second_bound),
        max_new_tokens=settings.max_new_tokens,
        max_k=max((i.num_speculative_tokens for i in infos), default=0),
        max_model_len=settings.max_model_len,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
        cuda=cuda_available(),
    )
    log.info(engine.line())
    run = EvalRun(settings=settings, drafters=infos, engine=engine)
    if not settings.baseline:  # drafters alone (acceptance during training): no speed ratio
        for info in infos:
            with _open(run, info, alive=1) as drafter:
                _warm_up(drafter, first[0], run, str(info.path))
                _record(run.records, str(info.path), first, drafter.measure(first, settings))
        return run
    if not settings.interleave:
        return _one_after_another(run, tokenizer, prompts, first)
    alive = 2 if infos else 1
    with _open(run, None, alive) as target:
        _warm_up(target, first[0], run, "target")
        if not infos:
            answers = target.measure(first, settings)
            _record(run.records, "target", first, answers)
            second = _second_turn(tokenizer, prompts, answers, settings)
            _record(run.records, "target", second, target.measure(second, settings))
        for i, info in enumerate(infos):
            with _open(run, info, alive) as drafter:
                _warm_up(drafter, first[0], run, str(info.path))
                rounds = run.rounds.setdefault(str(info.path), [])
                t1 = _interleaved(target, drafter, first, str(info.path), run, i == 0, rounds)
                if i == 0:
                    second = _second_turn(tokenizer, prompts, t1, settings)
                _interleaved(target, drafter, second, str(info.path), run, i == 0, rounds)
    return run


def _one_after_another(
    run: EvalRun, tokenizer: Any, prompts: list[EvalPrompt], first: list[Request]
) -> EvalRun:
    """``interleave=False``: the target alone once, then each drafter on the same requests
    (one engine alive at a time; speed ratios are not interleaved, so not reported)."""
    settings = run.settings
    # Each engine in a fresh process all the same: vLLM does not survive building many
    # engines in one process (the sixth failed in its kernel registry on CPU).
    with _open(run, None, 1, separate=True) as target:
        _warm_up(target, first[0], run, "target")
        answers = target.measure(first, settings)
        _record(run.records, "target", first, answers)
        second = _second_turn(tokenizer, prompts, answers, settings)
        _record(run.records, "target", second, target.measure(second, settings))
    for info in run.drafters:
        with _open(run, info, 1, separate=True) as drafter:
            _warm_up(drafter, first[0], run, str(info.path))
            for requests in (first, second):
                _record(run.records, str(info.path), requests, drafter.measure(requests, settings))
    return run


def _second_turn(
    tokenizer: Any, prompts: list[EvalPrompt], answers: list[Measured], settings: EvalSettings
) -> list[Request]:
    """Turn 2 of every two-turn prompt, with the target's own first answer in the context."""
    return [
        Request(
            p,
            2,
            render_turn(
                tokenizer,
                p,
                [str(tokenizer.decode(a.tokens, skip_special_tokens=True))],
                settings.chat_template_kwargs,
            ),
        )
        for p, a in zip(prompts, answers, strict=True)
        if settings.turns == 2 and len(p.turns) > 1
    ]


def _interleaved(
    target: EngineProcess,
    drafter: EngineProcess,
    requests: list[Request],
    name: str,
    run: EvalRun,
    record_target: bool,
    rounds: list[Round],
) -> list[Measured]:
    """Both engines in alternating rounds; records the drafter's (and, once, the target's)
    requests and appends the rounds. Returns the target's measurements."""
    if not requests:
        return []
    t, d, new_rounds = interleave(
        target,
        drafter,
        [r.token_ids for r in requests],
        _sampling(run.settings),
        run.settings.round_size,
        _seeds(requests, run.settings),
    )
    offset = len(rounds)
    for r in new_rounds:
        r.index += offset
    rounds.extend(new_rounds)
    size = run.settings.round_size
    round_of = [offset + i // size for i in range(len(requests))]
    if record_target:
        _record(run.records, "target", requests, t, round_of)
    _record(run.records, name, requests, d, round_of)
    return t


class EngineProcess:
    """A ``VllmEngine`` in its own process when two engines must be alive at once
    (``separate``), when it runs with an environment of its own, when it would load numba
    (an n-gram engine) or when this process has loaded it (``engine_starts_here``); else in
    this one."""

    def __init__(
        self, kwargs: dict[str, Any], separate: bool = False, env: dict[str, str] | None = None
    ) -> None:
        apart = (
            separate
            or bool(env)
            or opens_numba(kwargs.get("speculative_config"))
            or not engine_starts_here()
        )
        self.engine: Any = Remote(_open_engine, kwargs, env=env) if apart else _open_engine(kwargs)

    def _call(self, method: str, *args: Any) -> Any:
        if isinstance(self.engine, Remote):
            return self.engine.call(method, *args)
        return getattr(self.engine, method)(*args)

    def generate(self, prompts: list[list[int]], sampling: dict[str, Any]) -> list[list[int]]:
        return self._call("generate", prompts, sampling)

    def generate_one_by_one(
        self, prompts: list[list[int]], sampling: dict[str, Any], seeds: list[int] | None = None
    ) -> list[Measured]:
        return self._call("generate_one_by_one", prompts, sampling, seeds)

    def measure(self, requests: list[Request], settings: EvalSettings) -> list[Measured]:
        prompts = [r.token_ids for r in requests]
        return self.generate_one_by_one(prompts, _sampling(settings), _seeds(requests, settings))

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.close()


def _open_engine(kwargs: dict[str, Any]) -> VllmEngine:
    return VllmEngine(**kwargs).open()


def _open(
    run: EvalRun, drafter: DrafterInfo | None, alive: int, separate: bool = False
) -> EngineProcess:
    """An engine, in its own process when ``alive`` > 1, ``separate`` or the run sets an
    environment for its engines (CPU threads); on CUDA the ``alive`` engines sharing the GPU
    split its memory."""
    settings = run.settings
    engine = run.engine
    assert engine is not None  # chosen by _run_one before any engine opens
    share = settings.gpu_memory_utilization
    if share is None and alive > 1 and cuda_available():
        share = 0.9 / alive
    return EngineProcess(
        dict(
            model=settings.target,
            dtype=settings.dtype,
            max_model_len=engine.max_model_len,
            kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
            speculative_config=drafter.speculative_config() if drafter else None,
            gpu_memory_utilization=share,
        ),
        separate=alive > 1 or separate,
        env=engine.env,
    )


def _sampling(settings: EvalSettings) -> dict[str, Any]:
    """The requests' sampling parameters, less the seed (``_seeds``: one per request)."""
    return sampling_params(settings, settings.max_new_tokens, settings.ignore_eos)


def _seeds(requests: list[Request], settings: EvalSettings) -> list[int] | None:
    """Each request's seed (from the run's seed, the prompt id and the turn); None: greedy."""
    if settings.temperature == 0:
        return None
    return [request_seed(settings.seed, r.prompt.id, r.turn) for r in requests]


def _warm_up(engine: EngineProcess, request: Request, run: EvalRun, name: str) -> None:
    """One untimed request: the first one of an engine pays one-off setup costs. Sampled
    runs serve it twice with one seed and record whether the tokens were the same."""
    settings = run.settings
    if settings.temperature == 0:
        engine.generate([request.token_ids], dict(temperature=0.0, max_tokens=8))
        return
    seed = request_seed(settings.seed, request.prompt.id, request.turn)
    params = sampling_params(settings, 8, False, seed)
    first, again = (engine.generate([request.token_ids], params)[0] for _ in range(2))
    run.reproducible[name] = first == again


def render_turn(
    tokenizer: Any, prompt: EvalPrompt, answers: list[str], kwargs: dict[str, Any]
) -> list[int]:
    """The token ids served for turn ``len(answers) + 1`` of ``prompt``: its system message,
    the earlier user turns each followed by its answer, this user turn, the generation
    prompt."""
    messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
    for i, answer in enumerate(answers):
        messages += [
            {"role": "user", "content": prompt.turns[i]},
            {"role": "assistant", "content": answer},
        ]
    messages.append({"role": "user", "content": prompt.turns[len(answers)]})
    source = f"the chat template of --target {tokenizer.name_or_path}"
    return chat_token_ids(
        tokenizer, messages, add_generation_prompt=True, source=source, template_kwargs=kwargs
    )


def _record(
    records: list[dict[str, Any]],
    name: str,
    requests: list[Request],
    measured: list[Measured],
    rounds: list[int] | None = None,
) -> None:
    for i, (req, (tokens, delta, seconds, steps)) in enumerate(
        zip(requests, measured, strict=True)
    ):
        records.append(
            {
                "model": name,
                "id": req.prompt.id,
                "category": req.prompt.category,
                "turn": req.turn,
                "round": None if rounds is None else rounds[i],
                "prompt_tokens": len(req.token_ids),
                "new_tokens": len(tokens),
                "seconds": seconds,
                "drafts": delta.drafts,  # counter deltas around this request alone
                "accepted": delta.accepted,
                # target forwards after the prefill (steps.py): what tokens per target
                # step divides by; recomputable from new_tokens, accepted and drafts
                "decode_steps": len(steps.tokens)
                if steps is not None
                else decode_steps(len(tokens), delta.accepted, delta.drafts),
                "acceptance_length": delta.acceptance_length,
                "accepted_per_pos": delta.accepted_per_pos,
                "output": tokens,
                # per decode step (engine/trace.py): context length, tokens added, draft
                # tokens verified, accepted; what the by-context tables are made of
                **(steps.as_record() if steps is not None else {}),
            }
        )
