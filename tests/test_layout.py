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
