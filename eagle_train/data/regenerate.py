"""Regenerate assistant turns with the target itself (train on the target's own responses).

For each conversation, each assistant turn in order: prompt = the messages before it (with
the earlier turns already regenerated) rendered with the generation prompt; the target's
response replaces the turn's content. The turn-i prompts of a batch of conversations are
generated together. Finished records are appended to a JSONL (OpenAI format, with their
``id``) as each batch completes; a rerun with ``resume`` skips ids already there.

Every input record ends up done, skipped (a bad record, under ``on_bad_record: skip``) or
failed (its generation failed, e.g. the prompt does not fit ``max_model_len``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from eagle_train.data.answers import answer_message
from eagle_train.data.chat import ChatRenderer
from eagle_train.data.errors import BadRecordPolicy, DataError
from eagle_train.data.generation import GenerationBackend
from eagle_train.data.messages import Message
from eagle_train.data.records import Record

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegenerationPlan:
    """What to generate, and where the response stops."""

    max_new_tokens: int
    max_model_len: int
    batch_size: int
    seed: int
    answer_trailing_user: bool
    stop_token_ids: tuple[int, ...]


@dataclass
class RegenerationReport:
    path: Path
    num_records: int = 0
    done: int = 0
    resumed: int = 0  # of `done`, found in `path` from an earlier run
    skipped: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    num_generated_turns: int = 0
    num_cut_turns: int = 0  # responses that reached the token limit without a stop token
    num_generated_tokens: int = 0
    seconds: float = 0.0  # generating, the engine's start not included
    done_ids: set[str] = field(default_factory=set, repr=False)

    def summary(self) -> str:
        return (
            f"regenerated {self.done} of {self.num_records} records ({self.resumed} from an earlier "
            f"run), skipped {sum(self.skipped.values())} {dict(self.skipped)}, failed "
            f"{sum(self.failed.values())} {dict(self.failed)}; {self.num_generated_turns} turns "
            f"generated, {self.num_cut_turns} cut at the limit -> {self.path}"
        )


@dataclass
class _Conversation:
    record: Record
    messages: list[Message]
    targets: list[int]  # indices of the assistant messages to generate, in order
    status: str = "ok"  # "ok" | "skipped" | a failure reason


def stop_token_ids(renderer: ChatRenderer, extra_eos: Iterable[int] = ()) -> tuple[int, ...]:
    """eos ids plus the template's end-of-turn token (e.g. ``<|im_end|>``) when it is one token."""
    tok = renderer.tokenizer
    ids = set(extra_eos)
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    end_of_turn = renderer.end_of_turn_text()
    if end_of_turn:
        eot_ids = tok(end_of_turn, add_special_tokens=False)["input_ids"]
        if len(eot_ids) == 1:
            ids.add(eot_ids[0])
        else:
            logger.warning(
                "end-of-turn text %r is %d tokens; stopping on eos only", end_of_turn, len(eot_ids)
            )
    if not ids:
        raise DataError(
            "the tokenizer has no eos token and the template no end-of-turn token", reason="config"
        )
    return tuple(sorted(ids))


def open_output(path: Path, settings: dict[str, Any], resume: bool) -> tuple[TextIO, set[str]]:
    """Open the regenerated JSONL for appending; return it and the ids already done."""
    meta_path = path.with_name(path.name + ".meta.json")
    settings = json.loads(json.dumps(settings))  # compare as stored (tuples become lists)
    done: set[str] = set()
    if (path.exists() or path.is_symlink()) and not (
        path.is_file() and not path.is_symlink() and meta_path.is_file()
    ):
        # Only a file an earlier regeneration wrote (with its settings beside it) is resumed
        # or started again from empty: anything else is the user's.
        raise DataError(
            f"regenerate.output_path {path} exists and was not written by a regeneration "
            f"(no {meta_path.name} beside it): refusing to overwrite it; choose another path",
            reason="config",
        )
    if resume and path.exists():
        previous = json.loads(meta_path.read_text())
        changed = sorted(
            k for k in settings.keys() | previous.keys() if settings.get(k) != previous.get(k)
        )
        if changed:
            diff = ", ".join(f"{k}: {previous.get(k)!r} -> {settings.get(k)!r}" for k in changed)
            raise DataError(
                f"{path} was written with other regeneration settings ({diff}); "
                "delete it or set regenerate.resume=false",
                reason="config",
            )
        done = _read_done_ids(path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        meta_path.write_text(json.dumps(settings, indent=1, sort_keys=True))
    return path.open("a", encoding="utf-8"), done


def _read_done_ids(path: Path) -> set[str]:
    ids: set[str] = set()
    good_bytes = 0
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                ids.add(str(json.loads(raw)["id"]))
            except (ValueError, KeyError, TypeError):
                if raw.endswith(b"\n"):
                    raise DataError(
                        f"{path}:{line_no}: not a regenerated record", reason="config"
                    ) from None
                # A line cut by a crash mid-write: drop it, that record is generated again.
                logger.warning("%s:%d: dropping an incomplete last line", path, line_no)
                break
            good_bytes += len(raw)
    with path.open("r+b") as f:
        f.truncate(good_bytes)
    return ids


def regenerate_records(
    records: Iterable[Record],
    renderer: ChatRenderer,
    backend: GenerationBackend,
    plan: RegenerationPlan,
    out: TextIO,
    report: RegenerationReport,
    policy: BadRecordPolicy,
) -> None:
    """Regenerate every record not yet in ``report.done_ids``; append done ones to ``out``."""
    pending = _skip_done(records, report)
    with tqdm(desc="regenerate", unit="conv") as bar:
        while batch := list(itertools.islice(pending, plan.batch_size)):
            convs = [
                c for c in (_plan_conversation(r, plan, policy) for r in batch) if c is not None
            ]
            _generate_turns(convs, renderer, backend, plan, report, policy)
            for conv in convs:
                if conv.status == "ok":
                    done = Record(
                        conv.record.id, conv.messages, conv.record.source, conv.record.line
                    )
                    out.write(json.dumps(done.to_json(), ensure_ascii=False) + "\n")
                    report.done += 1
                    report.done_ids.add(done.id)
                elif conv.status != "skipped":
                    report.failed[conv.status] += 1
            out.flush()
            bar.update(len(batch))
            elapsed = bar.format_dict["elapsed"] or 1e-9
            bar.set_postfix(tokens_per_s=f"{report.num_generated_tokens / elapsed:.0f}")


def _skip_done(records: Iterable[Record], report: RegenerationReport) -> Iterator[Record]:
    previous = set(report.done_ids)
    for record in records:
        if record.id in previous:
            report.done += 1
            report.resumed += 1
            previous.discard(record.id)
        else:
            yield record


def _plan_conversation(
    record: Record, plan: RegenerationPlan, policy: BadRecordPolicy
) -> _Conversation | None:
    messages = [dict(m) for m in record.messages]
    if plan.answer_trailing_user and messages[-1]["role"] == "user":
        messages.append({"role": "assistant", "content": ""})
    targets = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not targets:
        policy.count("no_assistant_turn", f"{record.where}: no assistant turn to regenerate")
        return None
    if targets[0] == 0:
        policy.handle(
            DataError(
                f"{record.where}: the conversation starts with an assistant turn (no prompt for it)",
                reason="assistant_first",
            )
        )
        return None
    return _Conversation(record, messages, targets)


def _generate_turns(
    convs: list[_Conversation],
    renderer: ChatRenderer,
    backend: GenerationBackend,
    plan: RegenerationPlan,
    report: RegenerationReport,
    policy: BadRecordPolicy,
) -> None:
    tok = renderer.tokenizer
    stop_ids = set(plan.stop_token_ids)
    for turn in range(max((len(c.targets) for c in convs), default=0)):
        active, prompts = _turn_prompts(convs, turn, renderer, plan, policy)
        if not active:
            continue
        limits = [min(plan.max_new_tokens, plan.max_model_len - len(p)) for p in prompts]
        seeds = [_turn_seed(plan.seed, c.record.id, turn) for c in active]
        for conv, gen, limit in zip(
            active, _generate_isolating(backend, prompts, limits, seeds), limits, strict=True
        ):
            if isinstance(gen, Exception):
                conv.status = f"generation_error:{type(gen).__name__}"
                logger.warning("%s: generation failed: %s", conv.record.where, gen)
                continue
            stopped = bool(gen) and gen[-1] in stop_ids
            # Exactly the generated text: no special-token skipping, no "clean up" of spaces
            # (which some tokenizers, e.g. Llama 3's, enable by default).
            content = tok.decode(
                gen[:-1] if stopped else gen,
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
            # The generated text is the whole turn (a tool call or a think block included, as
            # the model wrote them); the dataset's own versions no longer belong to it. It
            # becomes the fields the template writes back as that text (answers.py).
            i = conv.targets[turn]
            conv.messages[i] = answer_message(
                renderer, conv.messages[:i], content, conv.record.where
            )
            report.num_generated_turns += 1
            report.num_generated_tokens += len(gen)
            report.num_cut_turns += int(not stopped and len(gen) >= limit)


def _turn_prompts(
    convs: list[_Conversation],
    turn: int,
    renderer: ChatRenderer,
    plan: RegenerationPlan,
    policy: BadRecordPolicy,
) -> tuple[list[_Conversation], list[list[int]]]:
    active, prompts = [], []
    for conv in convs:
        if conv.status != "ok" or turn >= len(conv.targets):
            continue
        where = conv.record.where
        try:
            text = renderer.render(
                conv.messages[: conv.targets[turn]], add_generation_prompt=True, where=where
            )
        except DataError as err:
            conv.status = "skipped"
            policy.handle(err)
            continue
        ids = renderer.encode(text)
        if len(ids) >= plan.max_model_len:
            conv.status = "prompt_too_long"
            logger.warning(
                "%s: prompt of %d tokens does not fit max_model_len %d",
                where,
                len(ids),
                plan.max_model_len,
            )
            continue
        active.append(conv)
        prompts.append(ids)
    return active, prompts


def _generate_isolating(
    backend: GenerationBackend, prompts: list[list[int]], limits: list[int], seeds: list[int]
) -> list[list[int] | Exception]:
    """Generate a batch; if it fails, retry one by one so one bad prompt fails only itself."""
    try:
        return list(backend.generate(prompts, limits, seeds))
    except Exception as exc:
        if len(prompts) == 1:
            return [exc]
        logger.warning("batch generation failed (%s); retrying one prompt at a time", exc)
    results: list[list[int] | Exception] = []
    for prompt, limit, seed in zip(prompts, limits, seeds, strict=True):
        try:
            results.extend(backend.generate([prompt], [limit], [seed]))
        except Exception as exc:
            results.append(exc)
    failures = [r for r in results if isinstance(r, Exception)]
    if len(failures) == len(results):
        raise failures[-1]  # every prompt failed alone: the backend is broken, not the data
    return results


def _turn_seed(seed: int, record_id: str, turn: int) -> int:
    # Per-turn seeds make sampled output independent of batching and of resume (vLLM).
    digest = hashlib.sha256(f"{seed}:{record_id}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
