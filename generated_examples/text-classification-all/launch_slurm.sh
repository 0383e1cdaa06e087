#!/usr/bin/env bash
# [ddp] Several nodes under SLURM: one torchrun per node, which starts one process per GPU.
#   sbatch launch_slurm.sh --epochs 10
# To stop: `scancel JOBID`. SLURM stops, then kills, every process of the job's cgroup on
# every node, ranks included; a `kill` of one torchrun by hand does not reach ranks in sessions
# of their own, but on Linux each rank dies with its launcher (PR_SET_PDEATHSIG in train.py).
# [resume] On preemption SLURM sends SIGUSR1 (see --signal) 120 s before the end; train.py then
# saves <out-dir>/last.pt and exits with status 75, and this script requeues the job, which resumes.
#SBATCH --job-name=example-text-classification-all
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%j.out
# [resume] SIGUSR1 120 s before the time limit; a preempted job may be requeued
#SBATCH --signal=B:USR1@120
#SBATCH --requeue

set -uo pipefail

head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
gpus_per_node=${SLURM_GPUS_ON_NODE:-8}

# [resume] Forward the warning signal to every torchrun (and so to every train.py).
trap 'echo "SIGUSR1: asking train.py to checkpoint"; scancel --signal=USR1 "$SLURM_JOB_ID"' USR1

srun --kill-on-bad-exit=1 torchrun \
  --nnodes "$SLURM_NNODES" \
  --nproc-per-node "$gpus_per_node" \
  --rdzv-id "$SLURM_JOB_ID" \
  --rdzv-backend c10d \
  --rdzv-endpoint "$head_node:29500" \
  train.py "$@" &
pid=$!
wait "$pid"
status=$?
while kill -0 "$pid" 2>/dev/null; do  # the trap interrupted `wait`: wait for the real exit
  wait "$pid"
  status=$?
done
# [resume] preempted, checkpoint saved: run the job again
if [ "$status" -eq 75 ]; then
  echo "checkpoint saved on preemption: requeueing $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi

exit "$status"
