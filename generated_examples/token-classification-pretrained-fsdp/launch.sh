#!/usr/bin/env bash
# [fsdp] One node, one process per GPU (or, without GPUs, NPROC CPU processes with gloo).
#   ./launch.sh                 all visible GPUs (or 2 CPU processes)
#   NPROC=4 ./launch.sh --epochs 10
# The global batch is batch_size x NPROC per micro-batch.
# [grad-accum] An optimizer update sees batch_size x NPROC x grad_accum_steps samples.
set -euo pipefail
cd "$(dirname "$0")"
if command -v nvidia-smi >/dev/null 2>&1; then
  default_nproc=$(nvidia-smi --list-gpus | wc -l)
else
  default_nproc=2
fi
exec torchrun --standalone --nproc-per-node "${NPROC:-$default_nproc}" train.py "$@"
