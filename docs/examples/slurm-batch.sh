#!/bin/bash
#SBATCH --job-name=reshard
#SBATCH --array=0-7
#SBATCH --cpus-per-task=8
#SBATCH --mem=8G
#SBATCH --requeue
# One array task per part: keep --array at 0..PARTS-1. Paths and the part
# count may also come from the environment of `sbatch`.
PARTS=${PARTS:-8}
MODELS=${MODELS:-/models}
CONVERTED=${CONVERTED:-/converted}
reshard batch "$MODELS" --out "$CONVERTED" --part "$SLURM_ARRAY_TASK_ID/$PARTS" \
    --threads "${SLURM_CPUS_PER_TASK:-1}" --window 2GiB --no-progress \
    --report "$CONVERTED/.reports/part-$SLURM_ARRAY_TASK_ID.json"
