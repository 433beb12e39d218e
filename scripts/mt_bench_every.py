"""Write every Nth MT-Bench question (the package's copy) to a JSONL file, for
``eval-acceptance --set prompts=FILE``: ``python scripts/mt_bench_every.py N OUT``."""

import argparse
from importlib import resources

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("every", type=int, metavar="N", help="keep questions 0, N, 2N, ...")
parser.add_argument("out", metavar="OUT", help="the JSONL file to write")
args = parser.parse_args()
lines = resources.files("eagle_train.evaluate").joinpath("data/mt_bench/question.jsonl")
with open(args.out, "w", encoding="utf-8") as f:
    f.writelines(lines.read_text(encoding="utf-8").splitlines(True)[:: args.every])
