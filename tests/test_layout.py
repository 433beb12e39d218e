"""House rule: a draft algorithm lives in its folder under drafts/ and one registry line;
the loop, export, evaluation and data code never name one."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "eagle_train"
ALGORITHM = re.compile(r"eagle[-_ ]?[13]|p-?eagle|dflash", re.IGNORECASE)


def test_no_algorithm_names_outside_drafts() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "drafts":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if ALGORITHM.search(code) and not code.strip().startswith(('"', "'")):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "algorithm named outside drafts/:\n" + "\n".join(offenders)


# A draft or an export sees its target only through TargetDescription (eagle_train/target/):
# no HF config object, no model-type test (a Qwen3-MoE target once passed as "qwen3" and a
# gpt-oss one as "llama" that way).
TARGET_LEAK = re.compile(r"\.model_type\b|PretrainedConfig|AutoConfig|\.config\.|target\.config")


def test_drafts_and_export_see_the_target_only_through_its_description() -> None:
    files = [*sorted((PACKAGE / "drafts").rglob("*.py")), PACKAGE / "export.py"]
    offenders = []
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if TARGET_LEAK.search(code):
                offenders.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert not offenders, "target knowledge outside eagle_train/target/:\n" + "\n".join(offenders)
