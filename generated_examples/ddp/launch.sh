#!/usr/bin/env bash
# [ddp] One node, one process per GPU (or, without GPUs, NPROC CPU processes with gloo).
#   ./launch.sh                 all visible GPUs (or 2 CPU processes)
#   NPROC=4 ./launch.sh --epochs 10
# The global batch is batch_size x NPROC per micro-batch.
# To stop: Ctrl-C, or `kill PID` of torchrun: torchrun then stops its ranks. It starts each
# rank in a session of its own, so a `kill -9` of torchrun (or of its process group) never
# reaches them: on Linux each rank dies with its launcher (PR_SET_PDEATHSIG in train.py).
# A second training on the same --out-dir refuses to start while this one runs.
set -euo pipefail
cd "$(dirname "$0")"
if command -v nvidia-smi >/dev/null 2>&1; then
  default_nproc=$(nvidia-smi --list-gpus | wc -l)
else
  default_nproc=2
fi
exec torchrun --standalone --nproc-per-node "${NPROC:-$default_nproc}" train.py "$@"
