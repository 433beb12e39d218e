"""House rule: a draft algorithm lives in its folder under drafts/ and one registry line;
the loop, export, evaluation and data code never name one."""

from __future__ import annotations

import re
from pathlib import Path

from draft_cases import ALGORITHM_NAME as ALGORITHM
from draft_cases import ALGORITHMS

PACKAGE = Path(__file__).resolve().parents[2] / "eagle_train"


def test_the_name_pattern_catches_every_spelling() -> None:
    """The pattern comes from the registry: each name in its usual spellings, and not the
    package's own name or vLLM's method "eagle" (EAGLE-1's), which code may write."""
    assert ALGORITHMS, "the registry is empty"
    for name in ALGORITHMS:
        for spelling in (name, name.upper(), f"x = {name.title()}Draft()"):
            assert ALGORITHM.search(spelling), spelling
    for spelling in ("EAGLE-3", "eagle_1", "Eagle 3", "P-EAGLE", "p_eagle", "DFlash"):
        assert ALGORITHM.search(spelling), spelling
    for ok in ("import eagle_train.data", 'method = "eagle"', "EAGLE family", "flash_attn"):
        assert not ALGORITHM.search(ok), ok


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


# A draft or an export sees its target only through TargetDescription (eagle_train/target_model/):
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
    assert not offenders, "target knowledge outside eagle_train/target_model/:\n" + "\n".join(
        offenders
    )
