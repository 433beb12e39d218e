"""vLLM's OpenAI-compatible server on 127.0.0.1 serves an exported drafter: the
speculators-format export alone names the target and the method (``--model DRAFTER_DIR``);
chat completions come back with the target's own greedy answer, and /metrics counts the
drafts vLLM accepted. The server is stopped by the pid this test started."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from perfect_drafter import (
    AUX_LAYER_IDS,
    build_identity_target,
    build_perfect_eagle3,
    next_token_table,
)
from safetensors.torch import load_file
from transformers import AutoTokenizer

from eagle_train.config import load_config
from eagle_train.export import export_state
from eagle_train.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]
K = 3
STARTUP_TIMEOUT_S = 900  # about 3 minutes on a loaded 2-core machine; generous
PROMPTS = ["t7 t8 t9", "t40 t41", "t60"]
MAX_TOKENS = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read().decode())


def _counter(metrics: str, name: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if re.match(rf"{re.escape(name)}(\{{|\s)", line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _export(tmp_path: Path) -> tuple[Path, Path]:
    target = build_identity_target(tmp_path / "target")
    perfect = build_perfect_eagle3(target, tmp_path / "perfect", K)
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
        [
            f"target.path={target}",
            "target.dtype=float32",
            f"draft.aux_layer_ids={AUX_LAYER_IDS}",
            f"draft.ttt_steps={K}",
        ],
    )
    state = load_file(perfect / "model.safetensors")
    return target, export_state(state, cfg, tmp_path / "drafter", {"step": 0}, fmt="speculators")


def _wait_healthy(proc: subprocess.Popen, base: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            _get(base + "/health", timeout=5)
            return
        except OSError:
            time.sleep(3)
    raise AssertionError(f"server not healthy after {STARTUP_TIMEOUT_S} s")


@pytest.mark.slow
@pytest.mark.vllm
def test_openai_server_serves_the_drafter_alone(tmp_path: Path) -> None:
    target, drafter = _export(tmp_path)
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    # The server runs its engine core in a process of its own whatever this test set.
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["HF_HUB_OFFLINE"] = "1"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(drafter), "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "256",
        "--kv-cache-memory-bytes", str(64 * 2**20), "--chat-template", str(template),
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    started = time.monotonic()
    try:
        _wait_healthy(proc, base, log)
        print(f"server healthy after {time.monotonic() - started:.0f} s")
        model = json.loads(_get(base + "/v1/models"))["data"][0]["id"]
        table = next_token_table(target)
        tok = AutoTokenizer.from_pretrained(target)
        for text in PROMPTS:
            reply = _post(
                base + "/v1/chat/completions",
                {
                    "model": model,
                    "messages": [{"role": "user", "content": text}],
                    "temperature": 0.0,
                    "max_tokens": MAX_TOKENS,
                    "ignore_eos": True,
                    "skip_special_tokens": False,
                    "logprobs": True,
                },
            )
            got = [t["token"] for t in reply["choices"][0]["logprobs"]["content"]]
            # The target alone, computed without vLLM: its greedy next token of each token.
            ids, last = [], tok.convert_tokens_to_ids(text.split()[-1])
            for _ in range(MAX_TOKENS):
                last = table[last]
                ids.append(last)
            assert got == tok.convert_ids_to_tokens(ids), text
        metrics = _get(base + "/metrics")
    finally:
        proc.send_signal(signal.SIGINT)  # the pid this test started, nothing else
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    drafts = _counter(metrics, "vllm:spec_decode_num_drafts_total")
    accepted = _counter(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    print(f"/metrics: {drafts:.0f} drafts, {accepted:.0f} accepted, AL {1 + accepted / drafts:.3f}")
    assert drafts > 0
    # A perfect drafter: every drafted token accepted except where max_tokens cuts a draft.
    assert 1 + accepted / drafts >= K
