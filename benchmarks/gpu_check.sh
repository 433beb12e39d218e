#!/usr/bin/env bash
# One GPU check (about 8 minutes on one H200): prints the figures users on GPUs care about.
#
#   bash benchmarks/gpu_check.sh [--target DIR] [--out DIR]   # on a CUDA machine
#   bash benchmarks/gpu_check.sh --dry-run                     # the same steps on CPU, tiny sizes
#   bash benchmarks/gpu_check.sh --no-install --target smollm2-135m   # an offline machine
#
# Python: $PY, else .venv/bin/python, else python3. It must have CUDA torch and vLLM
# (`pip install -e ".[gpu]"` in an environment with CUDA torch, or the official vLLM image);
# when that Python lacks the package, it is installed with the gpu extra (needs PyPI), unless
# --no-install. The real target: --target DIR (a SmolLM2-135M-Instruct directory), else the
# project's `fetch-real-target` command when it exists; --target smollm2-135m (a shape in
# benchmarks/benchlib.py) builds random weights of its shape instead, which serves the throughput
# steps. A dry run uses the tiny demo world instead. Steps 5-7 need vLLM and a target directory:
# without them they are reported as skipped, with the reason.
#
# Steps (each prints its figures; a failed step is reported and the others still run):
#   1 environment          torch, CUDA, GPUs, vLLM
#   2 train SmolLM2        bf16 EAGLE-3 (seq 2048, K 7) and DFlash (512 blocks x 16): tokens/s, peak
#   3 train 8B shape       the same on a Llama-3.1-8B-shaped random target (no download)
#   3b memory 8B shape     bench_memory.py: peak memory per token per TTT step (element, block
#                          slot) against its bound at 8k and 32k tokens, EAGLE-3 K=7 (draft and
#                          full vocabulary), P-EAGLE, DFlash
#   4 optimizer            MasterWeightAdamW vs torch AdamW at 100M and 300M params
#   5 DDP                  NCCL, one GPU per process, when more than one GPU is present
#   6 regeneration         prepare-data regenerating chats with vLLM: generated tokens/s
#   7 acceptance           a short EAGLE-3 training on those chats, export, eval-acceptance on
#                          MT-Bench (CUDA graphs): AL, tokens/s, interleaved speedup
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
NO_INSTALL=0
TARGET=""
OUT=runs/gpu_check
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --no-install) NO_INSTALL=1 ;;
    --target) TARGET="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    *) echo "error: unknown argument '$1' (expected --dry-run, --no-install, --target DIR, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
FAILED=()
SKIPPED=()
step() {  # step NAME COMMAND...: run, time, remember a failure
  local name=$1; shift
  echo; echo "=== $name"
  local start=$SECONDS
  if "$@"; then echo "--- $name: ok ($((SECONDS - start)) s)"
  else echo "--- $name: FAILED ($((SECONDS - start)) s)"; FAILED+=("$name"); fi
}
skip() {  # skip NAME WHY
  echo; echo "=== $1"; echo "--- $1: skipped ($2)"; SKIPPED+=("$1")
}

if [ "$DRY" = 1 ]; then
  # The CPU recipe (in-process vLLM engine, no hub) and toy sizes.
  export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1
  DEVICE=cpu SEQ=128 K=2 ANCHORS=8 BLOCK=4 STEPS=1 SIZES=1M BIG=llama3-8b-mini
  CHATS=16 GEN_TOKENS=16 TRAIN_STEPS=2 EVAL_LIMIT=1 EVAL_TOKENS=8 KV="--set regenerate.kv_cache_memory_bytes=67108864"
  EVAL_KV="--set kv_cache_memory_bytes=67108864" MAXLEN=256
  REAL_AUX="1 2 3" BIG_AUX="1 2 3" TRAIN_AUX="[1,2,3]" BATCH=2  # 16 rows fill 2 ranks x 2
  MEM_SEQS="128 256" MEM_CASES="eagle3-k1-full dflash-b16-full"
else
  DEVICE=cuda SEQ=2048 K=7 ANCHORS=512 BLOCK=16 STEPS=3 SIZES=100M,300M BIG=llama3-8b
  CHATS=256 GEN_TOKENS=256 TRAIN_STEPS=200 EVAL_LIMIT=20 EVAL_TOKENS=256 KV="" EVAL_KV="" MAXLEN=2048
  REAL_AUX="2 15 27" BIG_AUX="2 16 29" TRAIN_AUX=null BATCH=8  # aux: vLLM's (2, L//2, L-3)
  MEM_SEQS="8192 32768" MEM_CASES="eagle3-k7-dv eagle3-k7-full peagle-k4-full dflash-b16-full"
fi

environment() {
  if [ "$DRY" = 0 ] && [ "$NO_INSTALL" = 0 ] \
    && ! "$PY" -c "import torch, vllm, eagle_train; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "installing the package with the gpu extra into $PY"
    "$PY" -m pip install -q -e ".[gpu]" || return 1
  fi
  "$PY" - <<'EOF'
import torch
import transformers
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| GPUs", torch.cuda.device_count(),
      "| transformers", transformers.__version__)
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name} {p.total_memory / 2**30:.0f} GiB")
try:
    import vllm
    print("vllm", vllm.__version__)
except Exception as exc:  # reported; the vLLM steps then fail on their own
    print("vllm not importable:", exc)
EOF
}

demo_world() {  # chats for regeneration; on a dry run also the target (barely pretrained)
  [ -f "$OUT/world/world.json" ] || "$PY" -m eagle_train.cli build-demo-world "$OUT/world" \
    --config configs/demo/tiny.yaml --set pretrain.steps=2 --set "families=[llama]"
}

real_target() {  # sets TARGET
  if [ -n "$TARGET" ] && [ ! -e "$TARGET" ] && "$PY" -c \
    "import sys; sys.path.insert(0, 'benchmarks'); import benchlib; assert sys.argv[1] in benchlib.SHAPES" \
    "$TARGET" 2>/dev/null; then
    echo "target: random weights of the shape $TARGET (benchmarks/benchlib.py)"; return 0
  fi
  if [ "$DRY" = 1 ]; then
    demo_world || return 1
    TARGET="$OUT/world/targets/llama/bf16"
  elif [ -z "$TARGET" ]; then
    if "$PY" -m eagle_train.cli fetch-real-target --help >/dev/null 2>&1; then
      "$PY" -m eagle_train.cli fetch-real-target "$OUT/smollm2" || return 1
      TARGET="$OUT/smollm2/bf16"
    else
      echo "error: no real target: pass --target DIR (SmolLM2-135M-Instruct)" >&2; return 1
    fi
  fi
  [ -f "$TARGET/config.json" ] || { echo "error: $TARGET/config.json not found" >&2; return 1; }
  echo "target: $TARGET"
}

train_figures() {  # train_figures TARGET [EAGLE-3 aux ids]
  "$PY" benchmarks/bench_train.py --target "$1" --device "$DEVICE" --seqs "$SEQ" --ks "$K" \
    --steps "$STEPS" --aux-layer-ids $2 || return 1
  "$PY" benchmarks/bench_dflash.py --target "$1" --device "$DEVICE" --seq "$SEQ" \
    --anchors "$ANCHORS" --block "$BLOCK" --steps "$STEPS"
}

ddp() {
  local n
  n=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  if [ "$DRY" = 0 ] && [ "$n" -lt 2 ]; then echo "one GPU: no DDP run"; return 0; fi
  local extra=()
  if [ "$DRY" = 1 ]; then n=2; extra=(--set train.device=cpu); fi
  PYTHON="$PY" NPROC=$n bash scripts/launch.sh -c configs/train/eagle3-llama-demo.yaml \
    --set target.path="$TARGET" --set data.train="$OUT/data" --set data.val=null \
    --set draft.aux_layer_ids="$TRAIN_AUX" --set draft.draft_vocab_size=null \
    --set data.max_length="$MAXLEN" \
    --set data.micro_batch_size="$BATCH" \
    --set train.max_steps=$((TRAIN_STEPS < 20 ? TRAIN_STEPS : 20)) --set train.log_every=1 \
    --set train.output_dir="$OUT/ddp" "${extra[@]}" --resume auto
}

regeneration() {
  local start=$SECONDS
  "$PY" -m eagle_train.cli prepare-data -c configs/data/demo.yaml \
    --set "inputs=[$OUT/world/data/train.jsonl]" --set limit="$CHATS" --set tokenizer="$TARGET" \
    --set output_dir="$OUT/data" --set max_length="$MAXLEN" --set regenerate.backend=vllm \
    --set regenerate.max_new_tokens="$GEN_TOKENS" --set regenerate.resume=false $KV || return 1
  "$PY" - "$OUT/data.regenerated.jsonl" "$TARGET" $((SECONDS - start)) <<'EOF'
import json, sys
from transformers import AutoTokenizer
path, target, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
tok = AutoTokenizer.from_pretrained(target)
n = sum(
    len(tok(m["content"], add_special_tokens=False)["input_ids"])
    for line in open(path)
    for m in json.loads(line)["messages"]
    if m["role"] == "assistant"
)
print(f"regenerated {n} tokens in {seconds:.0f} s (engine start included): {n / seconds:.0f} tokens/s")
EOF
}

acceptance() {
  "$PY" -m eagle_train.cli train-draft -c configs/train/eagle3-llama-demo.yaml \
    --set target.path="$TARGET" --set data.train="$OUT/data" --set data.val=null \
    --set draft.aux_layer_ids="$TRAIN_AUX" --set draft.ttt_steps=3 --set data.max_length="$MAXLEN" \
    --set draft.draft_vocab_size=null \
    --set data.micro_batch_size="$BATCH" \
    --set train.max_steps="$TRAIN_STEPS" --set train.save_every="$TRAIN_STEPS" \
    --set train.output_dir="$OUT/eagle3" --resume auto || return 1
  "$PY" -m eagle_train.cli export-draft "$OUT/eagle3" "$OUT/drafter" --overwrite || return 1
  "$PY" -m eagle_train.cli eval-acceptance --target "$TARGET" --draft "$OUT/drafter" \
    --set turns=1 --set num_prompts="$EVAL_LIMIT" --set max_new_tokens="$EVAL_TOKENS" $EVAL_KV \
    --out "$OUT/eval"
}

START=$SECONDS
step "1 environment" environment
step "real target" real_target
NO_VLLM=""  # why steps 5-7 cannot run, if they cannot
if ! "$PY" -c "import vllm" 2>/dev/null; then NO_VLLM="vLLM not importable"
elif [ ! -f "$TARGET/config.json" ]; then NO_VLLM="no target directory"
fi
[ "$DRY" = 1 ] || [ -n "$NO_VLLM" ] || demo_world >/dev/null
if [ -n "$TARGET" ]; then
  step "2 train (real target)" train_figures "$TARGET" "$REAL_AUX"
fi
step "3 train ($BIG random target)" train_figures "$BIG" "$BIG_AUX"
# shellcheck disable=SC2086  # MEM_SEQS and MEM_CASES are word lists
step "3b memory ($BIG shape)" "$PY" benchmarks/bench_memory.py --shape "$BIG" --device "$DEVICE" \
  --seqs $MEM_SEQS --cases $MEM_CASES --steps 1
step "4 optimizer" "$PY" benchmarks/bench_optimizer.py --device "$DEVICE" --sizes "$SIZES" --steps "$STEPS"
for name in "6 regeneration" "5 DDP" "7 acceptance"; do
  if [ -n "$NO_VLLM" ]; then skip "$name" "$NO_VLLM"
  else fn=${name#* }; step "$name" "${fn,,}"; fi  # "5 DDP" runs ddp
done
echo
echo "gpu_check: $((SECONDS - START)) s; failed steps: ${#FAILED[@]}${FAILED:+ (${FAILED[*]})};" \
  "skipped steps: ${#SKIPPED[@]}${SKIPPED:+ (${SKIPPED[*]})}"
[ ${#FAILED[@]} -eq 0 ]
