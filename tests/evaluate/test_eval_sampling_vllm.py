"""eval-acceptance at temperature 1 in real vLLM (with its greedy pass beside), on the tiny demo target, an EAGLE-3 export
and the n-gram floor: two runs with one seed give the target alone's same per-prompt outputs,
another seed other outputs; the report states per engine whether a seeded request reproduced;
the counters are what rejection sampling allows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_configs import target_path

from eagle_train.config import load_config
from eagle_train.data.vocab import build_vocab_mapping
from eagle_train.drafts.registry import get_draft
from eagle_train.evaluate.harness import run_eval
from eagle_train.evaluate.report import summarize, to_markdown
from eagle_train.evaluate.settings import EvalSettings
from eagle_train.export import export_state
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
K = 3
NEW = 16


def _export(tiny_world: Path, out: Path) -> Path:
    target_dir = target_path(tiny_world, "llama", "fp32")
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
        [f"target.path={target_dir}", "target.dtype=float32", "data.train=d"]
        + [f"draft.ttt_steps={K}", "draft.draft_vocab_size=256"],
    )
    target = FrozenTarget.from_pretrained(target_dir, dtype=torch.float32)
    vocab = build_vocab_mapping(torch.arange(target.config.vocab_size).flip(0).float(), 256)
    torch.manual_seed(0)
    state = get_draft("eagle3").build(cfg.draft, target, vocab).state_dict()
    return export_state(state, cfg, out, {"step": 0})


def _key(r: dict) -> tuple:
    return (r["model"], r["id"], r["turn"])


@pytest.fixture(scope="module")
def runs(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("sampled")
    drafter = _export(tiny_world, root / "drafter")

    def settings(seed: int, drafters: list[Path], beside_greedy: bool = False) -> EvalSettings:
        return EvalSettings(
            target=target_path(tiny_world, "llama", "fp32"),
            drafters=drafters,
            prompts=str(tiny_world / "data" / "val.jsonl"),
            num_prompts=3,
            turns=1,
            max_new_tokens=NEW,
            dtype="float32",
            max_model_len=512,
            kv_cache_memory_bytes=64 * 2**20,
            ignore_eos=True,
            interleave=False,
            temperature=1.0,
            seed=seed,
            beside_greedy=beside_greedy,
        )

    both = [drafter, Path("ngram")]
    first = run_eval(settings(7, both, beside_greedy=True))
    again = run_eval(settings(7, [drafter]))
    other = run_eval(settings(8, [Path("ngram")]))
    return {"first": first, "again": again, "other": other, "drafter": drafter}


def test_one_seed_reproduces_the_target_and_the_report_says_whether_drafters_do(
    runs: dict,
) -> None:
    """The target alone reproduces every output with one seed. Drafters are served through
    vLLM's rejection sampler, which on this vLLM (0.32, CPU) does not reproduce a seeded
    request (measured 2026-12-01: 0 of 3 outputs alike across the two runs, for EAGLE-3
    and for n-gram, and each one's warm-up drew differently twice);
    the run checks it per engine and the report states what it found."""
    first = {_key(r): r for r in runs["first"].records}
    again = {_key(r): r for r in runs["again"].records}
    assert len(first) == 3 * 3 and len(again) == 2 * 3  # target, drafter(, ngram)
    for key, r in first.items():
        if key[0] == "target":
            assert r["output"] == again[key]["output"], key
    assert runs["first"].reproducible["target"] is True
    names = {"target", str(runs["drafter"]), "ngram"}
    assert runs["first"].reproducible.keys() == names
    same = {
        name: sum(r["output"] == again[k]["output"] for k, r in first.items() if k[0] == name)
        for name in ("target", str(runs["drafter"]))
    }
    print(f"outputs equal across two runs with one seed (of 3 each): {same}")
    print(f"warm-up reproduced per engine: {runs['first'].reproducible}")
    md = to_markdown(summarize(runs["first"]))
    for name in names - {"target"}:
        ok = runs["first"].reproducible[name]
        assert ("the same tokens" if ok else "**different tokens**") in md


def test_the_seed_is_what_makes_the_samples(runs: dict) -> None:
    first = {_key(r): r["output"] for r in runs["first"].records if r["model"] == "target"}
    other = {_key(r): r["output"] for r in runs["other"].records if r["model"] == "target"}
    assert first.keys() == other.keys()
    # 16 tokens at temperature 1 from a 512-token model: another seed draws other text
    assert any(first[k] != other[k] for k in first)


def test_counters_are_what_rejection_sampling_allows(runs: dict) -> None:
    for r in runs["first"].records:
        assert r["new_tokens"] == NEW  # ignore_eos
        if r["model"] == "target":
            assert r["drafts"] == 0
            continue
        assert 0 <= r["accepted"] <= K * r["drafts"]
        per_pos = r["accepted_per_pos"]
        # position k is accepted only after position k-1: counts never grow with k
        assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False)), per_pos
        assert sum(per_pos) == r["accepted"]
    for r in runs["first"].records:
        if r["model"] == str(runs["drafter"]):
            # EAGLE-3 drafts at every decode step, and a step yields its accepted tokens
            # plus one: the 15 tokens after the prefill's take between 15/(K+1) and 15 steps
            assert 0 < r["drafts"] <= NEW - 1 <= r["drafts"] + r["accepted"]
    summary = summarize(runs["first"])
    for d in summary["drafters"].values():
        assert d["greedy_equal_to_target"] is None
    md = to_markdown(summary)
    sampled_part = md.split("## Sampled beside greedy")[0]
    assert "Decoding: sampled (temperature 1; seed 7" in md and "Greedy outputs" not in sampled_part


def test_the_greedy_pass_beside_is_the_target_alones_greedy_decoding(runs: dict) -> None:
    """beside_greedy served the same requests at temperature 0: every proposer's output is
    the target alone's greedy one (lossless), the greedy target reproduces nothing random
    (its outputs do not depend on the seed), and the report's side-by-side numbers are
    each pass's own pooled figures."""
    greedy = runs["first"].greedy
    assert greedy is not None and greedy.settings.temperature == 0
    by_key = {_key(r): r for r in greedy.records}
    assert {k[1:] for k in by_key} == {_key(r)[1:] for r in runs["first"].records}
    for (model, pid, turn), r in by_key.items():
        assert r["output"] == by_key[("target", pid, turn)]["output"], (model, pid)
    summary = summarize(runs["first"])
    for name in (str(runs["drafter"]), "ngram"):
        beside = summary["sampled_vs_greedy"][name]
        assert (
            beside["greedy"]
            == summary["greedy"]["drafters"][name]["overall"]["tokens_per_target_step"]
        )
        assert beside["sampled"] == summary["drafters"][name]["overall"]["tokens_per_target_step"]
        eq = summary["greedy"]["drafters"][name]["greedy_equal_to_target"]
        assert eq == {"equal": 3, "requests": 3}
    print(to_markdown(summary).split("## Sampled beside greedy")[1].split("# Greedy pass")[0])
