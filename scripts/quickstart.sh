#!/usr/bin/env bash
# The main job on the built-in demo world, from a fresh clone: set up a CPU environment,
# build the tiny world (tokenizer, Llama and Qwen3 targets, chat data; no downloads), then
# prepare the training set with the target's own regenerated answers and a draft vocabulary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu.sh
. .venv/bin/activate
export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$PWD/runs/.vllm_cache"
if [ ! -f runs/demo_world/world.json ]; then
    build-demo-world runs/demo_world --config configs/demo/default.yaml
fi
prepare-data --config configs/data/demo.yaml "$@"
