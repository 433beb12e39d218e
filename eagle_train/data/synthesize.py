"""User prompts from the target itself: training data with no dataset at all.

The chat template is rendered up to the opening of a user turn (everything before the user's
text: bos, the system message or the template's default one, the user header), and the target
samples what a user would write there, up to its end-of-turn token. Each request has its own
seed (``seed + request index``): one shared seed would give every request the same prompt.
With ``stems``, request r's user turn starts with stem r mod len (the target writes the rest,
and the kept prompt is the stem and its continuation). Prompts are normalised (whitespace), filtered (cut at the token limit, too short, too long,
holding template markup) and deduplicated (case- and whitespace-insensitive), and written as
OpenAI JSONL records with one user turn each; regeneration then adds the target's answers.
With ``follow_ups``, each record holds a second user turn after an empty assistant turn
(kept prompt k gets follow-up number ``Random(seed)``'s k-th draw), and regeneration answers
both, in order.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from eagle_train.data.chat import ChatRenderer
from eagle_train.data.config import SynthesizeConfig
from eagle_train.data.errors import DataError
from eagle_train.data.generation import GenerationBackend, Sampling
from eagle_train.data.stems import load_follow_ups, load_stems
from eagle_train.data.store import COMMAND
from eagle_train.ownership import owned_file

log = logging.getLogger(__name__)

MARKER = "\x00USER\x00"


@dataclass
class SynthesisReport:
    path: Path
    requests: int = 0
    kept: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0  # sampling and filtering, the engine's start not included

    def summary(self) -> str:
        return (
            f"synthesised {self.kept} user prompts from {self.requests} samples, rejected "
            f"{sum(self.rejected.values())} {dict(sorted(self.rejected.items()))} -> {self.path}"
        )


def user_turn_opening(renderer: ChatRenderer, system: str | None) -> str:
    """The rendered text before a user turn's content, e.g. ``...<|im_start|>user\\n``."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": MARKER})
    text = renderer.render(messages, where="synthesize")
    if MARKER not in text:
        raise DataError(
            "the chat template does not write the user's text verbatim; prompts cannot be "
            "synthesised with it",
            reason="config",
        )
    return text[: text.index(MARKER)]


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def rejection(
    text: str, stopped: bool, cfg: SynthesizeConfig, markup: tuple[str, ...]
) -> str | None:
    """Why a sampled prompt is not kept, or None."""
    if not stopped:
        return "cut_at_limit"
    if any(m in text for m in markup):
        return "template_markup"
    if len(text.split()) < cfg.min_words:
        return "too_short"
    if len(text) > cfg.max_chars:
        return "too_long"
    return None


def synthesize_prompts(
    renderer: ChatRenderer,
    backend: GenerationBackend,
    cfg: SynthesizeConfig,
    stop_ids: tuple[int, ...],
    path: Path,
) -> SynthesisReport:
    """Sample, filter and deduplicate user prompts; write them to ``path`` (temp + rename)."""
    tok = renderer.tokenizer
    opening = user_turn_opening(renderer, cfg.system)
    stems = load_stems(cfg.stems) or ("",)
    follow_ups = load_follow_ups(cfg.follow_ups)
    prompts = [renderer.encode(opening + stem) for stem in stems]
    markup = tuple(t for t in tok.all_special_tokens if t)
    stops = set(stop_ids)
    sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p)
    max_requests = cfg.max_requests or 4 * cfg.num_prompts
    report = SynthesisReport(path=path)
    seen: set[str] = set()
    kept: list[str] = []
    while len(kept) < cfg.num_prompts and report.requests < max_requests:
        n = min(cfg.batch_size, max_requests - report.requests)
        requests = range(report.requests, report.requests + n)
        seeds = [cfg.seed + r for r in requests]
        batch = [prompts[r % len(prompts)] for r in requests]
        outputs = backend.generate(batch, [cfg.max_new_tokens] * n, seeds, sampling)
        report.requests += n
        for r, gen in zip(requests, outputs, strict=True):
            stopped = bool(gen) and gen[-1] in stops
            raw = tok.decode(gen[:-1] if stopped else gen, skip_special_tokens=False)
            text = normalise(stems[r % len(stems)] + raw)
            reason = rejection(text, stopped, cfg, markup)
            key = text.lower()
            if reason is None and key in seen:
                reason = "duplicate"
            if reason is not None:
                report.rejected[reason] += 1
                continue
            seen.add(key)
            kept.append(text)
    kept = kept[: cfg.num_prompts]
    report.kept = len(kept)
    if not kept:
        raise DataError(f"no usable prompts synthesised ({report.summary()})", reason="empty")
    write_prompts(path, kept, follow_ups, cfg)
    log.info("%s", report.summary())
    return report


def write_prompts(
    path: Path,
    prompts: list[str],
    follow_ups: tuple[str, ...],
    cfg: SynthesizeConfig,
) -> None:
    """The prompts as OpenAI JSONL, each with a follow-up drawn from ``follow_ups`` (none if
    empty); ids are ``synth-<index>``. Written to a temporary, renamed over ``path`` only
    when that is absent or prepare-data's own as it wrote it (``ownership.owned_file``)."""
    rng = random.Random(cfg.seed)
    seconds = [rng.choice(follow_ups) for _ in prompts] if follow_ups else None
    system = cfg.system
    lines = []
    for i, text in enumerate(prompts):
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": text})
        if seconds is not None:
            messages.append({"role": "assistant", "content": ""})
            messages.append({"role": "user", "content": seconds[i]})
        lines.append(json.dumps({"id": f"synth-{i:06d}", "messages": messages}) + "\n")
    with owned_file(path, "synthesize.output_path", COMMAND) as tmp:
        tmp.write_text("".join(lines), encoding="utf-8")
