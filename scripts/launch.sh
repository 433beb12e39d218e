#!/usr/bin/env bash
# Launch train-draft on one or several nodes with torchrun (DDP: gloo on CPU, NCCL on GPU).
#
#   One node, all its GPUs:     scripts/launch.sh -c configs/train/eagle3-llama-demo.yaml
#   Two CPU processes:          NPROC=2 scripts/launch.sh -c ... --set train.device=cpu
#   Several nodes: run the same command on every node with
#     NNODES=4 NODE_RANK=<0..3> MASTER_ADDR=<node 0 host> MASTER_PORT=29500 scripts/launch.sh -c ...
#   Preempted or crashed? Relaunch the same command with --resume auto: every rank continues
#   bit-exactly from the newest intact checkpoint in train.output_dir (a shared filesystem
#   on several nodes). If a rank fails, torchrun stops the others and exits non-zero.
#
# Extra torchrun flags (e.g. --max-restarts 3 to restart in place after a failure; pair it
# with --resume auto) go in TORCHRUN_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python

if [ -z "${NPROC:-}" ]; then
  NPROC=$("$PY" -c "import torch; print(torch.cuda.device_count() or 1)")
fi
NNODES="${NNODES:-1}"

if [ "$NNODES" = "1" ]; then
  RDZV=(--standalone)
else
  : "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}" "${NODE_RANK:?set NODE_RANK}"
  RDZV=(--nnodes "$NNODES" --node-rank "$NODE_RANK" --rdzv-backend c10d
        --rdzv-endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" --rdzv-id "${RDZV_ID:-eagle-train}")
fi

# shellcheck disable=SC2086
exec "$PY" -m torch.distributed.run "${RDZV[@]}" --nproc-per-node "$NPROC" ${TORCHRUN_ARGS:-} \
  -m eagle_train.cli train-draft "$@"
