"""build-long-prompts into eval-acceptance in vLLM, on the tiny demo target with its context
raised to 4,096 positions: the n-gram proposer served on prompts of three length ranges is
reported in three context buckets, each bucket's figures the ones its records' step traces
give by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from run_configs import target_path

from eagle_train.demo.long_context import LongContextConfig, build_long_context
from eagle_train.evaluate.harness import run_eval
from eagle_train.evaluate.report import write_report
from eagle_train.evaluate.settings import EvalSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_long_prompts_are_reported_by_context_bucket(tiny_world: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    shutil.copytree(target_path(tiny_world), target)
    config = json.loads((target / "config.json").read_text())
    config["max_position_embeddings"] = 4096
    (target / "config.json").write_text(json.dumps(config))
    build_long_context(
        LongContextConfig(
            tokenizer=target,
            num_prompts=3,
            num_train=0,
            ranges=[(400, 900), (1100, 1900), (2100, 3600)],
            answer_room=64,
        ),
        tmp_path / "long",
    )
    settings = EvalSettings(
        target=target,
        drafters=[Path("ngram")],
        prompts=str(tmp_path / "long" / "prompts.jsonl"),
        turns=1,
        baseline=False,
        max_new_tokens=24,
        dtype="float32",
        max_model_len=4096,
        kv_cache_memory_bytes=64 * 2**20,
        ignore_eos=True,
    )
    run = run_eval(settings)
    summary = write_report(run, tmp_path / "eval")
    rows = {r["bucket"]: r for r in summary["drafters"]["ngram"]["context"]}
    prompts = [json.loads(line) for line in (tmp_path / "long" / "prompts.jsonl").open()]
    assert [p["prompt_tokens"] < 1024 for p in prompts] == [True, False, False]
    assert set(rows) == {"<1k", "1-2k", "2-4k"}
    for record in run.records:  # each request's steps all in one bucket, by hand
        first, last = record["step_context"][0], record["step_context"][-1]
        (bucket,) = {_bucket(first), _bucket(last)}
        steps = len(record["step_tokens"])
        assert steps == record["decode_steps"] and sum(record["step_tokens"]) == 23
        assert rows[bucket]["decode_steps"] == steps
        assert rows[bucket]["tokens_per_target_step"] == pytest.approx(23 / steps)
    assert "| 2-4k | 1 |" in (tmp_path / "eval" / "summary.md").read_text()


def _bucket(context: int) -> str:
    return "<1k" if context < 1024 else "1-2k" if context < 2048 else "2-4k"
