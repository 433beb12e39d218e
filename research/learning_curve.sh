#!/usr/bin/env bash
# The learning curve on a real target, SmolLM2-135M-Instruct, from no external data:
# MT-Bench tokens per target forward step against the supervised tokens the drafter saw.
#   1. prepare-data: SmolLM2 writes CURVE_MAX user prompts, then answers them (greedy)
#   2. nested subsets: the first N of those conversations, for each N in CURVE_SIZES
#   3. prepare-features per subset (the target runs once per row), train-draft EAGLE-3 from
#      the cache for CURVE_EPOCHS epochs, export-draft
#   4. floors: vLLM's n-gram proposer and a random-init drafter of the same shape
#   5. diversity: a set of the middle size synthesized with task stems (CURVE_STEMS_SIZE=N;
#      empty: none); optionally other algorithms at one size (CURVE_OTHERS="peagle dflash")
#   6. one eval-acceptance over MT-Bench (both turns, EVAL_NEW new tokens), n-gram first so
#      the paired statistics are every drafter minus n-gram; then the plot and the table
# Wall time per stage goes to $OUT/stage_times.tsv. A rerun continues: finished stages are kept.
#   EAGLE_TRAIN_REAL_TARGET=DIR  an already converted copy (DIR/bf16, DIR/fp32)
#   CURVE_DTYPE=float32|bfloat16 the target's compute dtype everywhere (default float32: a CPU
#                                without bf16 units runs it 3.5x faster, docs/results/2026-12-01-learning-curve.md)
#   CURVE_SIZES="50 160 512"     conversations per training set (the largest is synthesized)
#   CURVE_EPOCHS=4               epochs over each set
#   CURVE_STEMS_SIZE=N           the size of the stems arm (default: the middle size; empty: none)
#   CURVE_OTHERS="peagle"        also these algorithms (configs/train/ALGO-smollm2.yaml), at
#                                CURVE_OTHERS_SIZE (default: the middle size). DFlash trained at
#                                ~70 s/step on 2 CPU cores (against ~3 s for EAGLE-3): it is not
#                                in the measured run.
#   CURVE_PARTS="curve stems others eval"  the parts this invocation runs (two invocations
#                                with disjoint parts may run at once, e.g. one per core)
#   EVAL_EVERY=4                 evaluate on every 4th MT-Bench question (default: the first EVAL_LIMIT=80)
#   NO_SETUP=1                   use the commands already on PATH
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${NO_SETUP:-}" ]; then
    bash scripts/setup_cpu.sh
    . .venv/bin/activate
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$PWD/runs/.vllm_cache"
DTYPE=${CURVE_DTYPE:-float32}
SIZES=${CURVE_SIZES:-"50 160 512"}
EPOCHS=${CURVE_EPOCHS:-4}
EVAL_LIMIT=${EVAL_LIMIT:-80}
EVAL_NEW=${EVAL_NEW:-64}
MBS=4
MAX=$(printf '%s\n' $SIZES | sort -n | tail -1)
MID=$(printf '%s\n' $SIZES | sort -n | sed -n 2p)
PARTS=" ${CURVE_PARTS:-curve stems others eval} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${CURVE_OUT:-runs/curve}
REAL=${EAGLE_TRAIN_REAL_TARGET:-runs/smollm2}
[ "$DTYPE" = float32 ] && TARGET=$REAL/fp32 || TARGET=$REAL/bf16
mkdir -p "$OUT"
TIMES=$OUT/stage_times.tsv

stage() {  # stage NAME COMMAND...: run it, record its wall time and the load average
    local name=$1 start
    shift
    start=$(date +%s)
    echo "== $name: $*"
    "$@"
    printf '%s\t%s\t%s\n' "$name" "$(($(date +%s) - start))" "$(cut -d' ' -f1-3 /proc/loadavg)" |
        tee -a "$TIMES"
}
TRAIN=(--set "target.path=$TARGET" --set "target.dtype=$DTYPE" --set data.micro_batch_size=$MBS
    --set train.log_every=20)

[ -n "${EAGLE_TRAIN_REAL_TARGET:-}" ] || [ -d "$REAL/$( [ "$DTYPE" = float32 ] && echo fp32 || echo bf16)" ] ||
    stage fetch fetch-real-target "$REAL"
DATA=$OUT/data
STEMS=${CURVE_STEMS_SIZE-$MID}
OTHERS=${CURVE_OTHERS_SIZE:-$MID}

train_set() {  # train_set DATA_NAME RUN_NAME CONFIG: features, EPOCHS epochs of training, export
    local data=$1 name=$2 config=$3 rows steps
    local run=(-c "$config" "${TRAIN[@]}" --set "data.train=$DATA/$data"
        --set "data.features=$OUT/features/$data")
    [ -f "$OUT/features/$data/train/manifest.json" ] ||
        stage "features-$data" prepare-features "${run[@]}" --batch-tokens 2048
    rows=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['counts']['rows'])" \
        "$DATA/$data/meta.json")
    steps=$((EPOCHS * rows / MBS))
    stage "train-$name" train-draft "${run[@]}" --set train.max_steps=$steps \
        --set train.save_every=$steps --set optim.warmup_steps=$((steps / 20 + 1)) \
        --set "train.output_dir=$OUT/$name" --resume auto
    [ -f "$OUT/$name/drafter/config.json" ] ||
        stage "export-$name" export-draft "$OUT/$name" "$OUT/$name/drafter"
}
synthesize() {  # synthesize NAME N [prepare-data args]: the target writes N prompts and answers
    local name=$1 n=$2
    shift 2
    [ -f "$DATA/$name/meta.json" ] || stage "prepare-$name" prepare-data \
        -c configs/data/smollm2-synthesized.yaml --set "tokenizer=$TARGET" \
        --set "output_dir=$DATA/$name" --set synthesize.num_prompts="$n" \
        --set regenerate.dtype="$DTYPE" "$@"
}
subset() {  # subset N: the first N synthesized conversations (so the sets are nested)
    [ "$1" = "$MAX" ] || [ -f "$DATA/synth-$1/meta.json" ] || stage "subset-$1" prepare-data \
        -c configs/data/smollm2-synthesized.yaml --set "tokenizer=$TARGET" \
        --set "inputs=[$DATA/synth-$MAX.regenerated.jsonl]" --set synthesize.enabled=false \
        --set regenerate.enabled=false --set limit="$1" --set "output_dir=$DATA/synth-$1"
}

if part curve; then
    synthesize "synth-$MAX" "$MAX"
    for n in $SIZES; do
        subset "$n"
        train_set "synth-$n" "eagle3-$n" configs/train/eagle3-smollm2.yaml
    done
    # Floor: the same shape, never trained (lr 0 for one step keeps the initial weights).
    stage random-init train-draft -c configs/train/eagle3-smollm2.yaml "${TRAIN[@]}" \
        --set "data.train=$DATA/synth-$MAX" --set "data.features=$OUT/features/synth-$MAX" \
        --set optim.lr=0.0 --set optim.warmup_steps=0 --set train.max_steps=1 \
        --set train.save_every=1 --set "train.output_dir=$OUT/random" --resume auto
    [ -f "$OUT/random/drafter/config.json" ] ||
        stage export-random export-draft "$OUT/random" "$OUT/random/drafter"
fi
# Diversity: prompts opened with the package's task stems, against the unseeded ones, same size.
if part stems && [ -n "$STEMS" ]; then
    synthesize "stems-$STEMS" "$STEMS" --set synthesize.stems=builtin
    train_set "stems-$STEMS" "eagle3-stems-$STEMS" configs/train/eagle3-smollm2.yaml
fi
if part others && [ -n "${CURVE_OTHERS:-}" ]; then
    subset "$OTHERS"
    for algo in $CURVE_OTHERS; do
        train_set "synth-$OTHERS" "$algo-$OTHERS" "configs/train/$algo-smollm2.yaml"
    done
fi

if part eval; then
    DRAFTERS=(--draft ngram)
    for n in $SIZES; do DRAFTERS+=(--draft "$OUT/eagle3-$n/drafter"); done
    [ -z "$STEMS" ] || DRAFTERS+=(--draft "$OUT/eagle3-stems-$STEMS/drafter")
    for algo in ${CURVE_OTHERS:-}; do DRAFTERS+=(--draft "$OUT/$algo-$OTHERS/drafter"); done
    DRAFTERS+=(--draft "$OUT/random/drafter")
    # vLLM serves one request at a time (per-request counters): ~15 tokens/s here, ~11 minutes
    # per drafter for all 80 questions. EVAL_EVERY=4 takes every 4th question (20, every
    # category) instead of the first EVAL_LIMIT.
    if [ "${EVAL_EVERY:-1}" -gt 1 ]; then
        python scripts/mt_bench_every.py "$EVAL_EVERY" "$OUT/mt_bench_every$EVAL_EVERY.jsonl"
        PROMPTS=(--set "prompts=$OUT/mt_bench_every$EVAL_EVERY.jsonl")
    else
        PROMPTS=(--set num_prompts="$EVAL_LIMIT")
    fi
    stage eval eval-acceptance --target "$TARGET" "${DRAFTERS[@]}" --out "$OUT/eval" --overwrite \
        --set num_speculative_tokens=3 --set turns=2 "${PROMPTS[@]}" \
        --set max_new_tokens="$EVAL_NEW" --set dtype="$DTYPE" --set max_model_len=2048 \
        --set interleave=false
    stage plot python research/plot_learning_curve.py "$OUT/eval" --out "$OUT/learning_curve.png"
fi
cat "$TIMES"
