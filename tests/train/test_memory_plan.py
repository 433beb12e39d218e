"""train-draft's memory pre-flight: the estimate against hand arithmetic and against a
measured step, and the refusal of a run that does not fit, before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from run_configs import cli_args, run_sets, target_path
from torch import nn

from eagle_train.drafts.registry import get_draft
from eagle_train.drafts.vocab_loss import CHUNK_ELEMENTS, TargetHead
from eagle_train.memory_plan import (
    ACTIVATION_MARGIN,
    LOSS_CHUNK_TENSORS,
    DraftActivations,
    LayerShape,
    activation_bytes,
    loss_chunk_bytes,
    optimizer_bytes,
    target_head_bytes,
    unit_bytes,
)
from eagle_train.target_model.description import load_target_description

TINY = LayerShape(hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1, head_dim=32)
TESTS = Path(__file__).resolve().parents[1]


def _eagle3(units: int) -> DraftActivations:
    return DraftActivations(units, TINY, 1, first_input=128, first_norms=2, per_token=192, what="")


def test_unit_bytes_by_hand() -> None:
    # bf16 activations (2 bytes), H 64, I 128, 2 query heads, 1 key/value head of 32:
    # the two input norms (fp32 input 256 + rsqrt 4 + bf16 output 128 each): 776;
    # attention: q/k/v input 128, q and output 2*64, k/v repeated 2*64, k/v 2*32 elements in
    # bf16 (896) + the log-sum-exp, 2 heads fp32 (8): 904; post-attention norm 388; MLP
    # 4*128*2 = 1024; residual 128; final norm 388 + the loss's head-input gradient 128 and
    # 8 fp32 per row 32: 548.
    assert unit_bytes(_eagle3(1), act=2) == 776 + 904 + 388 + 1024 + 128 + 548
    # 100 units over 50 tokens (2 TTT steps), fc's 192 feature elements kept once per token
    listed = 100 * 3768 + 50 * 192 * 2
    assert activation_bytes(_eagle3(100), 50, act=2) == ACTIVATION_MARGIN * listed
    # a second layer takes an H-wide input behind one norm: 388 + (64 + 2*64 + 2*64 + 2*32)*2
    # + 8 + 388 + 1024 + 128
    two = DraftActivations(1, TINY, 2, first_input=128, first_norms=2, per_token=0, what="")
    assert unit_bytes(two, act=2) - unit_bytes(_eagle3(1), act=2) == 2704


def test_loss_chunk_and_optimizer_by_hand() -> None:
    # 1,000 rows of a 512-token vocabulary fit one chunk; 10**6 rows are capped at the chunk
    assert loss_chunk_bytes(1000, 512, 2**23) == 1000 * 512 * 4 * LOSS_CHUNK_TENSORS
    assert loss_chunk_bytes(10**6, 512, 2**23) == 2**23 * 4 * LOSS_CHUNK_TENSORS
    # bf16 draft: fp32 masters + two fp32 moments; fp32 draft: the moments only; without
    # masters: two bf16 moments
    assert optimizer_bytes(1000, 2, True) == 12_000
    assert optimizer_bytes(1000, 4, True) == 8_000
    assert optimizer_bytes(1000, 2, False) == 4_000


def test_the_target_head_part_is_what_a_step_copies() -> None:
    """A bf16 head of 33,024 rows on CPU: the tensors a step makes beside the loaded head
    (the draft vocabulary's rows, their fp32 copy for the matmul) have the plan's bytes; the
    full vocabulary makes only the fp32 copy."""
    vocab, hidden, draft_vocab = 33_024, 64, 4_000
    head = nn.Linear(hidden, vocab, bias=False).to(torch.bfloat16)
    features = SimpleNamespace(head=head, final=torch.randn(2, 7, hidden).to(torch.bfloat16))
    ids = torch.randperm(vocab)[:draft_vocab]
    for subset, scored in ((None, vocab), (ids, draft_vocab)):
        target = TargetHead.of(features, subset)  # type: ignore[arg-type]
        rows = target.rows(torch.tensor([0, 1, 1]), torch.tensor([6, 0, 3]))
        made = {t.data_ptr(): t for t in (target.weight, rows.weight)}
        made.pop(head.weight.data_ptr(), None)
        copied = sum(t.numel() * t.element_size() for t in made.values())
        expected = target_head_bytes(scored, hidden, 2, subset=subset is not None, upcast=True)
        assert copied == expected == scored * hidden * (4 + (2 if subset is not None else 0))


def test_eagle3_spec_states_tokens_times_ttt_steps(tiny_world: Path) -> None:
    spec = get_draft("eagle3")
    cfg = spec.config_cls(aux_layer_ids=[1, 2, 3], ttt_steps=5)
    desc = load_target_description(target_path(tiny_world))
    acts = spec.activations(cfg, desc, tokens=300, rows=2)
    assert (acts.units, acts.num_layers, acts.first_input, acts.per_token) == (1500, 1, 128, 192)
    assert acts.layer == TINY


@pytest.mark.slow
def test_a_measured_step_stays_under_the_estimate() -> None:
    """One EAGLE-3 step (K=7, 1 row of 256 tokens, fp32 draft at the tiny world's shape):
    its measured peak above the loaded state is below the estimate of what a step adds
    (gradients and the head's fp32 accumulator, activations, the loss's chunk), and the
    estimate is not loose by more than 2x (measured: 1.58x)."""
    rows, tokens, k = 1, 256, 7
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(TESTS / "memory_step_worker.py"), str(rows), str(tokens), str(k)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    measured = json.loads(out.stdout.splitlines()[-1])
    units = rows * tokens * k
    estimate = (
        activation_bytes(_eagle3(units), rows * tokens, act=4)
        + loss_chunk_bytes(units, 512, CHUNK_ELEMENTS)
        + measured["gradients"]
        + 512 * 64 * 4  # the loss's fp32 head-gradient accumulator
    )
    assert measured["peak"] <= estimate
    assert estimate <= 2 * measured["peak"], (estimate, measured)


def _train_draft(sets: list[str]) -> subprocess.CompletedProcess:
    """``eagle-train train-draft`` with ``sets``, in its own process (one thread)."""
    return subprocess.run(
        [sys.executable, "-m", "eagle_train.cli", "train-draft", *cli_args(sets)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )


def test_train_draft_refuses_a_run_that_does_not_fit(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    sets = run_sets(
        tiny_world,
        tiny_llama_data,
        out,
        "draft.ttt_steps=64",
        f"data.max_length={1 << 20}",
        "train.memory_limit_gib=0.05",
    )
    proc = _train_draft(sets)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "draft.ttt_steps=64" in errors[0] and "data.micro_batch_size=" in errors[0]
    assert "train.memory_check=false" in errors[0] and "0.05 GiB" in errors[0]
    assert not out.exists()


@pytest.mark.slow
def test_the_estimate_is_logged_and_the_check_can_be_skipped(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
) -> None:
    """Over the limit with ``memory_check=false``: the run trains one step, the estimate
    logged (the refusal test shows the same limit refuses with the check on)."""
    out = tmp_path / "run"
    sets = run_sets(
        tiny_world,
        tiny_llama_data,
        out,
        "train.max_steps=1",
        "train.memory_limit_gib=0.05",
        "train.memory_check=false",
        "draft.ttt_steps=64",
    )
    proc = _train_draft(sets)
    assert proc.returncode == 0, proc.stderr
    assert "memory: about" in proc.stderr and "at the peak per rank" in proc.stderr
    assert "target head 0.00 GiB" in proc.stderr  # the draft vocabulary's rows, in fp32 too
