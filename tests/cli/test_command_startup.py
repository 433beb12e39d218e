"""Every command does its start-up work, seen from outside: after the command has run (here
on input it refuses, so that it returns at once), an INFO record of the package shows on
stderr in the commands' format, and subnormal floats are flushed to zero in every thread of
torch's pool. tests/cli/test_subnormals.py checks the start-up helper; this checks that each
command calls it (a command that forgot would log nothing and train at half speed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from eagle_train.cli import APPS

# Per command: arguments it parses and then refuses in its body (a missing config, a
# checkpoint that is not there, a half-made target directory).
ARGS = {
    "build-demo-world": ["{tmp}/world", "-c", "{tmp}/missing.yaml"],
    "prepare-data": ["-c", "{tmp}/missing.yaml"],
    "train-draft": ["-c", "{tmp}/missing.yaml"],
    "prepare-features": ["-c", "{tmp}/missing.yaml"],
    "export-draft": ["{tmp}/missing-checkpoint", "{tmp}/out"],
    "eval-acceptance": ["-c", "{tmp}/missing.yaml"],
    "fetch-real-target": ["{tmp}/real", "--cache-dir", "{tmp}/cache"],
    "build-long-prompts": ["{tmp}/long", "-c", "{tmp}/missing.yaml"],
    "record-acceptance": ["{tmp}/missing-drafter", "{tmp}/missing-report"],
    "settings": ["no.such.section"],
}

# One process runs every command in turn, undoing the start-up work between them (no log
# handler, subnormals kept), and reports per command what a user would see after it.
SCRIPT = """
import json, logging, sys, torch
from eagle_train.cli import APPS
root = logging.getLogger()
report = {}
for name, args in json.loads(sys.argv[1]).items():
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    torch.set_flush_denormal(False)
    print(f"<{name}>", file=sys.stderr, flush=True)
    try:
        APPS[name](args, prog_name=name)
        code = 0
    except SystemExit as exc:
        code = exc.code
    logging.getLogger("eagle_train.startup_probe").info("after %s", name)
    torch.set_num_threads(2)
    x = torch.full((1 << 20,), 1e-39)
    report[name] = {"exit": code, "kept": int(((x * 1.5) != 0).sum())}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def after_each(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    tmp = tmp_path_factory.mktemp("startup")
    (tmp / "real" / "bf16").mkdir(parents=True)  # fetch-real-target refuses it at once
    args = {name: [a.format(tmp=tmp) for a in cmd] for name, cmd in ARGS.items()}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(args)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.splitlines()[-1]), out.stderr


def test_every_command_is_covered() -> None:
    assert sorted(ARGS) == sorted(APPS)


@pytest.mark.parametrize("name", sorted(ARGS))
def test_each_command_logs_and_flushes_subnormals(name: str, after_each) -> None:
    report, stderr = after_each
    assert report[name]["exit"] == 2, stderr  # refused in its body, after its start-up
    own = stderr.split(f"<{name}>")[1].split("\n<")[0]  # this command's part of stderr
    assert f" INFO eagle_train.startup_probe: after {name}" in own, own
    if torch.set_flush_denormal(False):  # this CPU can flush subnormals
        assert report[name]["kept"] == 0
