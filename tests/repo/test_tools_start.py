"""Every tool of benchmarks/, research/ and scripts/ starts: a Python tool answers --help with
exit 0 (its imports resolve and its arguments parse), a shell tool parses (bash -n). Their
behaviour is tested in the lab's tier (tests/lab/, ``pytest -m lab``); this only catches a tool
left behind by a move or a rename in the package."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBRARIES = {"benchlib.py", "ab.py"}  # imported by the tools, not run


def tools() -> list[Path]:
    found = [p for d in ("benchmarks", "research", "scripts") for p in (REPO / d).iterdir()]
    return sorted(p for p in found if p.suffix in (".py", ".sh") and p.name not in LIBRARIES)


def start(tool: Path) -> tuple[Path, subprocess.CompletedProcess]:
    if tool.suffix == ".sh":
        cmd = ["bash", "-n", str(tool)]
    else:
        cmd = [sys.executable, str(tool), "--help"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return tool, subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_every_tool_starts() -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(start, tools()))
    bad = [f"{t.relative_to(REPO)}: {r.stderr.strip()[-300:]}" for t, r in results if r.returncode]
    assert not bad, "\n".join(bad)
    assert len(results) >= 20
