"""Passage tasks: user turns that hand the target a text to work on.

Prompts sampled from a small target are one or two sentences; answers to them rarely repeat
their context, so a drafter trained on them learns little in-context copying, which chat
prompts with a pasted text (extract from it, reformat it, summarize it) are full of. Here
prompt k is passage task k mod len, a blank line, and the k-th passage: the first assistant
answer, of ``passage_min_words`` words at least, of a conversation in ``synthesize.passages``
(file order, so the first N conversations give the first N passages); their ids are
``passage-<k>``, so they can be prepared beside synthesized prompts (``synth-<k>``). The texts are the
target's own answers, so no external data enters. Follow-ups are drawn as for sampled
prompts (``synthesize.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

from eagle_train.data.config import SynthesizeConfig
from eagle_train.data.errors import DataError
from eagle_train.data.records import iter_raw, parse_record
from eagle_train.data.stems import load_passage_tasks
from eagle_train.data.synthesize import SynthesisReport, write_prompts


def passage_prompts(cfg: SynthesizeConfig, path: Path) -> SynthesisReport:
    """Write ``cfg.num_prompts`` passage-task prompts from ``cfg.passages`` to ``path``."""
    assert cfg.passages is not None
    source = cfg.passages  # prepare_data checked that it is a file
    tasks = load_passage_tasks(cfg.passage_tasks)
    start = time.perf_counter()
    report = SynthesisReport(path=path)
    kept: list[str] = []
    for line, obj in iter_raw(source):
        if len(kept) == cfg.num_prompts:
            break
        if isinstance(obj, DataError):
            raise obj
        record = parse_record(obj, str(source), line)
        report.requests += 1
        answer = next((m["content"] for m in record.messages if m["role"] == "assistant"), None)
        answer = answer if isinstance(answer, str) else ""
        if len(answer.split()) < cfg.passage_min_words:
            report.rejected["too_short"] += 1
            continue
        kept.append(f"{tasks[len(kept) % len(tasks)]}\n\n{answer.strip()}")
    if not kept:
        raise DataError(
            f"synthesize.passages: {source}: no assistant answer of "
            f"{cfg.passage_min_words} words or more",
            reason="empty",
        )
    report.kept = len(kept)
    write_prompts(path, kept, cfg, prefix="passage")
    report.seconds = time.perf_counter() - start
    return report
