"""Training runs launched as separate processes (tests/dist_worker.py under torchrun, or one
process), as a user would launch them, and waiting on them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from run_configs import target_path

REPO = Path(__file__).resolve().parents[1]


WORKER = REPO / "tests" / "dist_worker.py"


STEPS, SAVE_EVERY, KILL_AFTER = 24, 4, 8


def train_args(
    world: Path,
    data: Path,
    out: Path,
    micro_batch: int,
    accum: int,
    parallel: str = "ddp",
    algorithm: str = "eagle3",
) -> list[str]:
    sets = [
        f"train.parallel={parallel}",
        f"target.path={target_path(world)}",
        f"data.train={data}",
        "data.val=null",
        f"data.micro_batch_size={micro_batch}",
        "data.max_length=64",
        f"train.max_steps={STEPS}",
        f"train.grad_accum={accum}",
        "train.log_every=1",
        f"train.save_every={SAVE_EVERY}",
        "train.keep_last=3",
        "train.progress=false",
        "train.tensorboard=false",
        "optim.warmup_steps=2",
        f"train.output_dir={out}",
    ]
    # EAGLE-3 uses no randomness in training; DFlash samples anchors every step, so its
    # bitwise resume also proves every rank's RNG state is restored.
    sets.append("draft.ttt_steps=2" if algorithm == "eagle3" else "draft.num_anchors=16")
    if algorithm == "eagle3":  # DFlash predicts the target's whole vocabulary
        sets.append(f"draft.draft_vocab_size={VOCAB}")
    args = ["-c", str(REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml")]
    for s in sets:
        args += ["--set", s]
    return args


def launch(args: list[str], nproc: int, pid_dir: Path, **env: str) -> subprocess.Popen:
    pid_dir.mkdir(parents=True, exist_ok=True)
    if nproc == 1:
        cmd = [sys.executable, str(WORKER), *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(WORKER),
            *args,
        ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "EAGLE_TEST_PID_DIR": str(pid_dir), **env}
    return subprocess.Popen(
        cmd,
        env=full_env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output[-3000:]
    return output


def _gone(pid: int, within_s: float) -> bool:
    import os

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":  # exited, waiting for a reaper
            return True
        time.sleep(0.05)
    os.kill(pid, 9)
    return False


VOCAB = 64  # counted by the trainer over all ranks' shards
