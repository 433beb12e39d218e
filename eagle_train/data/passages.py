"""Passage tasks: user turns that hand the target a text to work on.

Prompts sampled from a small target are one or two sentences; answers to them rarely repeat
their context, so a drafter trained on them learns little in-context copying, which chat
prompts with a pasted text (extract from it, reformat it, summarize it) are full of. Here
prompt k is passage task k mod len, a blank line, and the k-th passage: the first assistant
answer, of ``passage_min_words`` words at least, of a conversation in ``synthesize.passages``
(file order, so the first N conversations give the first N passages); their ids are
``passage-<k>``, so they can be prepared beside synthesized prompts (``synth-<k>``). The
texts are the target's own answers, so no external data enters. Follow-ups are drawn as for
sampled prompts (``synthesize.py``).
"""

from __future__ import annotations

from pathlib import Path

from eagle_train.data.config import SynthesizeConfig
from eagle_train.data.errors import DataError
from eagle_train.data.records import read_records
from eagle_train.data.stems import load_follow_ups, load_passage_tasks
from eagle_train.data.synthesize import SynthesisReport, write_prompts


def passage_prompts(cfg: SynthesizeConfig, path: Path) -> SynthesisReport:
    """Write ``cfg.num_prompts`` passage-task prompts from ``cfg.passages`` to ``path``."""
    assert cfg.passages is not None
    source = cfg.passages  # prepare_data checked that it is a file
    tasks = load_passage_tasks(cfg.passage_tasks)
    follow_ups = load_follow_ups(cfg.follow_ups)
    report = SynthesisReport(path=path)
    kept: list[str] = []
    for record in read_records(source):
        report.requests += 1
        answer = next((m["content"] for m in record.messages if m["role"] == "assistant"), None)
        answer = answer if isinstance(answer, str) else ""
        if len(answer.split()) < cfg.passage_min_words:
            report.rejected["too_short"] += 1
            continue
        kept.append(f"{tasks[len(kept) % len(tasks)]}\n\n{answer.strip()}")
        if len(kept) == cfg.num_prompts:
            break  # the rest of the file is never read
    if not kept:
        raise DataError(
            f"synthesize.passages: {source}: no assistant answer of "
            f"{cfg.passage_min_words} words or more",
            reason="empty",
        )
    report.kept = len(kept)
    write_prompts(path, kept, follow_ups, cfg, prefix="passage")
    return report
