"""The lab's tests: benchmarks/ and research/ tools, out of the product's tiers (marker
``lab``, given to every test here by tests/conftest.py). Their scripts import each other as
plain modules, so both folders go on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for folder in ("research", "benchmarks"):
    sys.path.insert(0, str(REPO / folder))
