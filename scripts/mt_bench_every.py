"""Write every Nth MT-Bench question (the package's copy) to a JSONL file, for
``eval-acceptance --set prompts=FILE``: ``python scripts/mt_bench_every.py N OUT``."""

import sys
from importlib import resources

every, out = int(sys.argv[1]), sys.argv[2]
lines = resources.files("eagle_train.evaluate").joinpath("data/mt_bench/question.jsonl")
with open(out, "w", encoding="utf-8") as f:
    f.writelines(lines.read_text(encoding="utf-8").splitlines(True)[::every])
