"""``prepare-data``: records -> (optional regeneration by the target) -> tokens + loss masks.

Output: a directory the trainer loads with ``load_prepared`` (see ``store.py``), plus, when
regeneration is on, the regenerated conversations as OpenAI JSONL beside it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
from tqdm import tqdm

from eagle_train.data.backends import create_backend
from eagle_train.data.chat import ChatRenderer
from eagle_train.data.config import HubDataset, PrepareDataConfig
from eagle_train.data.errors import BadRecordPolicy, DataError
from eagle_train.data.generation import GenerationBackend, GenerationSettings
from eagle_train.data.records import (
    Record,
    RecordReader,
    read_records,
    record_byte_limit,
)
from eagle_train.data.regenerate import (
    RegenerationPlan,
    RegenerationReport,
    open_output,
    regenerate_records,
    stop_token_ids,
)
from eagle_train.data.store import (
    ExampleWriter,
    atomic_output_dir,
    check_outputs,
    regenerated_path,
    synthesized_path,
    write_meta,
)
from eagle_train.data.synthesize import SynthesisReport, synthesize_prompts
from eagle_train.data.tokenizer import load_tokenizer
from eagle_train.data.vocab import COUNTS_FILE, TokenCounter, save_token_counts
from eagle_train.fsutil import naming_disk_full

logger = logging.getLogger(__name__)


@dataclass
class PrepareReport:
    """What ``prepare_data`` did. ``num_examples + num_skipped + num_failed == num_records``."""

    output_dir: Path
    num_records: int = 0
    num_examples: int = 0  # records that gave at least one training row
    num_rows: int = 0  # training rows written (several per record for per-turn templates)
    skipped: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    num_tokens: int = 0
    num_assistant_tokens: int = 0
    num_truncated: int = 0
    regeneration: RegenerationReport | None = None
    synthesis: SynthesisReport | None = None
    counts_path: Path | None = None

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def num_failed(self) -> int:
        return sum(self.failed.values())

    def summary(self) -> str:
        lines = [
            f"prepared {self.num_examples} examples from {self.num_records} records "
            f"({self.num_rows} training rows) -> {self.output_dir}",
            f"  skipped {self.num_skipped} {dict(sorted(self.skipped.items()))}",
            f"  failed {self.num_failed} {dict(sorted(self.failed.items()))}",
            f"  tokens {self.num_tokens} (assistant {self.num_assistant_tokens}), "
            f"{self.num_truncated} truncated to max_length",
        ]
        if self.synthesis is not None:
            lines.append(f"  {self.synthesis.summary()}")
        if self.regeneration is not None:
            lines.append(f"  {self.regeneration.summary()}")
        if self.counts_path is not None:
            lines.append(f"  supervised-token counts -> {self.counts_path}")
        return "\n".join(lines)


def prepare_data(cfg: PrepareDataConfig) -> PrepareReport:
    # Fail on config mistakes before any expensive work (loading a model, generating).
    check_outputs(cfg)
    missing = [str(p) for p in cfg.inputs if not p.exists()]
    if missing:
        raise DataError(f"inputs not found: {', '.join(missing)}", reason="config")
    tokenizer = load_tokenizer(cfg.tokenizer)
    source = str(cfg.chat_template or f"the chat template of tokenizer {cfg.tokenizer}")
    renderer = ChatRenderer(
        tokenizer, _read_template(cfg.chat_template), cfg.chat_template_kwargs, source
    )
    # The trainer builds the draft vocabulary (of the draft's configured size) from these.
    counter = TokenCounter(_checked_vocab_size(cfg, tokenizer))
    policy = BadRecordPolicy(cfg.on_bad_record)
    inputs: list[Path | HubDataset] = [*cfg.inputs, *cfg.datasets]
    report = PrepareReport(output_dir=cfg.output_dir)
    records: Iterable[Record] = []
    regen_meta = None
    backend = open_backend(cfg, renderer) if cfg.synthesize.enabled else None
    try:
        if backend is not None:
            report.synthesis = run_synthesis(cfg, renderer, backend)
            inputs.append(report.synthesis.path)
        reader = RecordReader(inputs, policy, cfg.limit, record_byte_limit(cfg.max_length))
        records = reader
        if cfg.regenerate.enabled:
            report.regeneration, regen_meta = run_regeneration(
                cfg, renderer, reader, policy, backend
            )
            report.failed.update(report.regeneration.failed)
            records = read_regenerated(report.regeneration.path, report.regeneration.done_ids)
    finally:
        if backend is not None:
            backend.close()

    prepared = naming_disk_full(cfg.output_dir, "the prepared data")
    with prepared, atomic_output_dir(cfg.output_dir, cfg.overwrite) as tmp:
        writer = ExampleWriter(tmp)
        _write_examples(records, renderer, cfg.max_length, writer, counter, policy, report)
        report.num_records = reader.num_records
        report.skipped = Counter(policy.skipped)
        if writer.num_examples == 0:
            raise DataError(
                f"no usable examples in {len(inputs)} inputs ({report.summary()})",
                reason="empty",
            )
        writer.finish()
        counts = counter.result()
        save_token_counts(counts, tmp / COUNTS_FILE)
        counts_meta = {
            "file": COUNTS_FILE,
            "target_vocab_size": len(counts),
            "supervised_tokens": int(counts.sum()),
        }
        write_meta(tmp, _meta(cfg, renderer, report, regen_meta, counts_meta))
    report.counts_path = cfg.output_dir / COUNTS_FILE
    logger.info("prepared %d examples -> %s", report.num_examples, cfg.output_dir)
    return report


def _read_template(path: Path | None) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        raise DataError(f"{path}: chat template file not found", reason="config")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path}: not a chat template (byte {exc.start} is not UTF-8 text)", reason="config"
        ) from None


def _write_examples(
    records: Iterable[Record],
    renderer: ChatRenderer,
    max_length: int,
    writer: ExampleWriter,
    counter: TokenCounter,
    policy: BadRecordPolicy,
    report: PrepareReport,
) -> None:
    for record in tqdm(records, desc="tokenize", unit="conv"):
        try:
            rows = renderer.tokenize_rows(record.messages, max_length, record.where)
        except DataError as err:
            policy.handle(err)
            continue
        rows = [row for row in rows if row.num_assistant_tokens > 0]
        if not rows:
            # Not a data error: truncation (or a prompt-only record) left nothing to learn from.
            policy.count(
                "no_assistant_tokens", f"{record.where}: no assistant tokens within max_length"
            )
            continue
        report.num_examples += 1
        for n, chat in enumerate(rows, 1):
            # A template that rewrites earlier turns gives one row per assistant turn.
            writer.write(
                record.id if len(rows) == 1 else f"{record.id}#turn{n}",
                chat.input_ids,
                chat.loss_mask,
            )
            report.num_rows += 1
            report.num_tokens += len(chat.input_ids)
            report.num_assistant_tokens += chat.num_assistant_tokens
            report.num_truncated += int(chat.truncated)
            counter.add(chat.input_ids, chat.loss_mask)


def regeneration_plan(cfg: PrepareDataConfig, renderer: ChatRenderer) -> RegenerationPlan:
    rc = cfg.regenerate
    return RegenerationPlan(
        max_new_tokens=rc.max_new_tokens,
        max_model_len=rc.max_model_len or cfg.max_length,
        batch_size=rc.batch_size,
        seed=rc.seed,
        answer_trailing_user=rc.answer_trailing_user,
        stop_token_ids=stop_token_ids(renderer, _model_eos_ids(rc.model or cfg.tokenizer)),
    )


def open_backend(cfg: PrepareDataConfig, renderer: ChatRenderer) -> GenerationBackend:
    """The target as a generator (vLLM or transformers), set up from ``cfg.regenerate``."""
    rc = cfg.regenerate
    plan = regeneration_plan(cfg, renderer)
    pad = renderer.tokenizer.pad_token_id
    gen = GenerationSettings(
        dtype=rc.dtype,
        temperature=rc.temperature,
        top_p=rc.top_p,
        seed=rc.seed,
        stop_token_ids=plan.stop_token_ids,
        pad_token_id=plan.stop_token_ids[0] if pad is None else pad,
        max_model_len=plan.max_model_len,
        kv_cache_memory_bytes=rc.kv_cache_memory_bytes,
        max_num_seqs=rc.max_num_seqs,
        tensor_parallel_size=rc.tensor_parallel_size,
        data_parallel_size=rc.data_parallel_size,
    )
    return create_backend(rc.backend, rc.model or cfg.tokenizer, cfg.tokenizer, gen)


def run_regeneration(
    cfg: PrepareDataConfig,
    renderer: ChatRenderer,
    reader: RecordReader,
    policy: BadRecordPolicy,
    backend: GenerationBackend | None = None,
) -> tuple[RegenerationReport, dict[str, Any]]:
    """Regenerate every record into the JSONL; return the report and the settings used.
    ``backend``: an open one to use (and leave open); None opens and closes one here."""
    rc = cfg.regenerate
    model = rc.model or cfg.tokenizer
    path = regenerated_path(cfg)
    plan = regeneration_plan(cfg, renderer)
    # Everything that changes the generated text; a resumed run must match it.
    settings = {
        "model": str(model.resolve()),
        "chat_template_sha256": renderer.template_sha256,
        "chat_template_kwargs": renderer.template_kwargs,
        "dtype": rc.dtype,
        "temperature": rc.temperature,
        "top_p": rc.top_p,
        **{k: v for k, v in dataclasses.asdict(plan).items() if k != "batch_size"},
    }
    out, done_ids = open_output(path, settings, rc.resume)  # before the slow model load
    report = RegenerationReport(path=path, done_ids=done_ids)
    with out:
        own = backend is None
        gen_backend = open_backend(cfg, renderer) if backend is None else backend
        try:
            start = time.perf_counter()
            regenerate_records(reader, renderer, gen_backend, plan, out, report, policy)
            report.seconds = time.perf_counter() - start
        finally:
            if own:
                gen_backend.close()
    report.num_records = reader.num_records
    report.skipped = Counter(policy.skipped)
    logger.info("%s", report.summary())
    return report, {"settings": settings, "backend": gen_backend.name, "path": str(path.resolve())}


def run_synthesis(
    cfg: PrepareDataConfig, renderer: ChatRenderer, backend: GenerationBackend
) -> SynthesisReport:
    """The user prompts, sampled from the target."""
    path = synthesized_path(cfg)
    start = time.perf_counter()
    stop_ids = regeneration_plan(cfg, renderer).stop_token_ids
    report = synthesize_prompts(renderer, backend, cfg.synthesize, stop_ids, path)
    report.seconds = time.perf_counter() - start
    return report


def read_regenerated(path: Path, ids: set[str]) -> Iterator[Record]:
    """The records of ``ids`` from a regenerated JSONL (each once, in file order)."""
    wanted = set(ids)
    for record in read_records(path):
        if record.id in wanted:
            wanted.discard(record.id)
            yield record


def _model_eos_ids(model: Path) -> list[int]:
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(str(model)).eos_token_id
    except OSError:  # no generation_config.json
        return []
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _checked_vocab_size(cfg: PrepareDataConfig, tokenizer: Any) -> int:
    """The target vocab size, checked against the config before any expensive work."""
    vocab_size = resolve_target_vocab_size(cfg, tokenizer)
    if len(tokenizer) > vocab_size:
        raise DataError(
            f"the tokenizer has {len(tokenizer)} tokens but the target vocabulary is {vocab_size}",
            reason="config",
        )
    return vocab_size


def resolve_target_vocab_size(cfg: PrepareDataConfig, tokenizer: Any) -> int:
    """V, the length of the counts: configured, else the model's ``vocab_size``, else ``len(tokenizer)``."""
    if cfg.vocab.target_vocab_size is not None:
        return cfg.vocab.target_vocab_size
    for path in (cfg.regenerate.model, cfg.tokenizer):
        if path is not None and (path / "config.json").is_file():
            config = json.loads((path / "config.json").read_text())
            size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
            if size:
                return int(size)
    return len(tokenizer)


def _meta(
    cfg: PrepareDataConfig,
    renderer: ChatRenderer,
    report: PrepareReport,
    regen_meta: dict[str, Any] | None,
    counts_meta: dict[str, Any],
) -> dict[str, Any]:
    import transformers

    import eagle_train

    if regen_meta is not None and report.regeneration is not None:
        r = report.regeneration
        regen_meta = {
            **regen_meta,
            "done": r.done,
            "resumed": r.resumed,
            "failed": dict(r.failed),
            "seconds": round(r.seconds, 1),  # this run's generation (resumed rows excluded)
        }
    return {
        "tokenizer": str(cfg.tokenizer.resolve()),
        "chat_template": {
            "source": str(cfg.chat_template.resolve()) if cfg.chat_template else "tokenizer",
            "sha256": renderer.template_sha256,
            "method": "generation_blocks" if renderer.uses_generation_blocks else "prefix_diff",
        },
        "max_length": cfg.max_length,
        "sources": [str(p.resolve()) for p in cfg.inputs] + [d.label for d in cfg.datasets],
        "chat_template_kwargs": cfg.chat_template_kwargs,
        "synthesis": (
            None
            if report.synthesis is None
            else {
                "path": str(report.synthesis.path.resolve()),
                "requests": report.synthesis.requests,
                "kept": report.synthesis.kept,
                "rejected": dict(sorted(report.synthesis.rejected.items())),
                "seconds": round(report.synthesis.seconds, 1),
                **cfg.synthesize.model_dump(mode="json"),
            }
        ),
        "limit": cfg.limit,
        "on_bad_record": cfg.on_bad_record,
        "counts": {
            "records": report.num_records,
            "examples": report.num_examples,
            "rows": report.num_rows,
            "skipped": dict(sorted(report.skipped.items())),
            "failed": dict(sorted(report.failed.items())),
            "tokens": report.num_tokens,
            "assistant_tokens": report.num_assistant_tokens,
            "truncated": report.num_truncated,
        },
        "regeneration": regen_meta,
        "token_counts": counts_meta,
        "versions": {
            "eagle_train": getattr(eagle_train, "__version__", "unknown"),
            "transformers": transformers.__version__,
            "datasets": datasets.__version__,
        },
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
