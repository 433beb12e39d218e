"""One eval-acceptance run measures every golden foreign drafter (written by speculators,
SafeAILab's and z-lab's own code) beside this project's exports, paired with the first, and
leaves every drafter directory byte for byte as it was. One engine start per drafter."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from run_configs import target_path
from transformers import AutoTokenizer
from typer.testing import CliRunner

from eagle_train.cli import eval_acceptance_app
from eagle_train.engine.remote import Remote
from eagle_train.evaluate.harness import _open_engine, render_turn
from eagle_train.evaluate.prompts import load_prompts

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ASSETS = Path(__file__).resolve().parents[1] / "assets"
FOREIGN = {
    "speculators-eagle3": (ASSETS / "speculators" / "eagle3-llama-tiny", "speculators"),
    "speculators-peagle": (ASSETS / "drafters" / "speculators-peagle", "speculators"),
    "speculators-dflash": (ASSETS / "drafters" / "speculators-dflash", "speculators"),
    "speculators-dflash-vocab": (ASSETS / "drafters" / "speculators-dflash-vocab", "speculators"),
    "safeailab-eagle1": (ASSETS / "drafters" / "safeailab-eagle1", "safeailab"),
    "safeailab-eagle3": (ASSETS / "drafters" / "safeailab-eagle3", "safeailab"),
    "zlab-dflash": (ASSETS / "drafters" / "zlab-dflash", "native"),
}
MAX_NEW = 16
K = 3


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_every_layout_measured_beside_our_export(wide_world: Path, tmp_path: Path) -> None:
    from exported_drafts import export_random

    target = target_path(wide_world, "llama", "fp32")
    ours = export_random(wide_world, "llama", tmp_path / "ours")
    card = ours / "README.md"
    card.write_text(card.read_text() + "\n## My notes\n\nkept as written\n")
    drafters = [ours]
    for name, (path, _) in FOREIGN.items():
        drafters.append(tmp_path / name)
        shutil.copytree(path, drafters[-1])
    # SafeAILab's EAGLE-3 names no aux layers, and on the 4-layer tiny target vLLM's default
    # (2, 2, 1) feeds it 2 of the 3 its fc reads (refused: test_eval_any_drafter.py); its
    # layout (midlayer.*, d2t/t2d in pytorch_model.bin) is kept, the layers named.
    config_file = tmp_path / "safeailab-eagle3" / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}))
    before = {str(d): digest(d) for d in drafters}
    args = ["--target", str(target), "--out", str(tmp_path / "eval")]
    for d in drafters:
        args += ["--draft", str(d)]
    settings = [
        "num_prompts=2",
        "turns=1",
        f"max_new_tokens={MAX_NEW}",
        f"num_speculative_tokens={K}",
        "interleave=false",
        "dtype=float32",
    ]
    for s in settings:
        args += ["--set", s]
    result = CliRunner().invoke(eval_acceptance_app, args)
    assert result.exit_code == 0, result.output

    # The drafters are inputs: not one byte of any of them changed (the user's card section
    # included).
    assert {str(d): digest(d) for d in drafters} == before
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert list(summary["drafters"]) == [str(d) for d in drafters]
    for name, (_, layout) in FOREIGN.items():
        row = summary["drafters"][str(tmp_path / name)]
        assert row["source"]["layout"] == layout, name
        assert row["overall"]["requests"] == 2 and row["num_speculative_tokens"] == K
        # greedy speculative decoding in fp32 keeps the target's own tokens
        assert row["greedy_equal_to_target"] == {"equal": 2, "requests": 2}, name
    assert summary["drafters"][str(ours)]["source"]["made_by"].startswith("eagle-train")
    # each foreign drafter paired with our export, request by request
    assert [(p["a"], p["b"]) for p in summary["paired"]] == [
        (str(ours), str(d)) for d in drafters[1:]
    ]
    assert all(p["n"] == 2 for p in summary["paired"])

    # Engine settings chosen from the prompts and printed in the report.
    records = [
        json.loads(line)
        for line in (tmp_path / "eval" / "per_prompt.jsonl").read_text().splitlines()
    ]
    longest = max(r["prompt_tokens"] for r in records)
    engine = summary["engine"]
    assert engine["max_model_len"] == longest + MAX_NEW + K
    markdown = (tmp_path / "eval" / "summary.md").read_text()
    assert f"Engine: max_model_len {longest + MAX_NEW + K}" in markdown
    assert "NUMBA_NUM_THREADS=1" in markdown or "NUMBA_NUM_THREADS" in engine["env_kept"]

    # Greedy outputs do not depend on the thread settings: the target alone again, with
    # every core and no binding chosen by the harness, gives the same tokens.
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = load_prompts("mt_bench", 2)
    ids = [render_turn(tokenizer, p, [], {}) for p in prompts]
    cores = sorted(os.sched_getaffinity(0))
    env = {
        "OMP_NUM_THREADS": str(len(cores)),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
    }
    kwargs = dict(
        model=target,
        dtype="float32",
        max_model_len=engine["max_model_len"],
        kv_cache_memory_bytes=engine["kv_cache_memory_bytes"],
    )
    with Remote(_open_engine, kwargs, env=env) as remote:
        again = remote.call("generate_greedy", ids, MAX_NEW)
    alone = {r["id"]: r["output"] for r in records if r["model"] == "target"}
    assert again == [alone[p.id] for p in prompts]
