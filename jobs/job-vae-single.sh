#!/bin/bash
# Frontier: the DDP VAE as one job, store and training in the same ranks (method 1 over CXI).
#   VENV=~/envs/dd sbatch -A <project> jobs/job-vae-single.sh                  # 2 nodes x 8 ranks, 1 GCD each
#   LOADER=torch WORKERS=4 sbatch -A <project> jobs/job-vae-single.sh   # forked DataLoader workers
#SBATCH -J vae-single
#SBATCH -o vae-single-%j.out
#SBATCH -t 00:20:00
#SBATCH -p batch
#SBATCH -N 2
#SBATCH --gpus-per-node=8
#SBATCH --network=single_node_vni,job_vni

set -euo pipefail
module load PrgEnv-gnu
module load rocm/7.1.1
module load miniforge3
# module load craype-accel-amd-gfx90a    # GPU-aware MPI, if the build uses it
# The environment with torch, mpi4py and pyddstore: VENV=/path/to/env sbatch -A <project> jobs/job-vae-single.sh
: "${SLURM_JOB_ACCOUNT:?submit with an account: VENV=/path/to/env sbatch -A <project> jobs/job-vae-single.sh}"
: "${VENV:?set VENV to the virtual or conda environment with torch, mpi4py and pyddstore}"
if [ -f "$VENV/bin/activate" ]; then
    # shellcheck disable=SC1091  # the user's environment, not in this repository
    . "$VENV/bin/activate"
else
    export PATH="$VENV/bin:$PATH"    # a conda prefix
fi

cd "${SLURM_SUBMIT_DIR:-.}"
export DDSTORE_METHOD=${DDSTORE_METHOD:-1}
export DDSTORE_FABRIC=cxi
export DDSTORE_QUIET=1
LOADER=${LOADER:-thread}     # thread: ThreadDataLoader; torch: forked DataLoader workers
WORKERS=${WORKERS:-1}
EPOCHS=${EPOCHS:-10}
if [ "$LOADER" = torch ]; then
    # Forked workers: memhooks instead of Frontier's default kdreg2 (pyddstore sets it from this).
    export DDSTORE_FORK_WORKERS=1
fi
# MIOpen's cache in node-local storage: many ranks on a shared home directory collide.
export MIOPEN_USER_DB_PATH=/tmp/miopen-$USER-$SLURM_JOB_ID
export MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_USER_DB_PATH

NRANKS=$((SLURM_JOB_NUM_NODES * 8))
srun -N "$SLURM_JOB_NUM_NODES" -n "$NRANKS" --ntasks-per-node=8 --gpus-per-task=1 --gpu-bind=closest \
    -c 7 --cpu-bind=threads \
    python examples/vae/vae-ddp.py --epochs "$EPOCHS" --num-workers "$WORKERS" --loader "$LOADER" \
    --gpu-dest --gpu-source

# Without MPI: the DDP group is the store's communicator (method 1).
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
DDSTORE_MPI=0 srun -N "$SLURM_JOB_NUM_NODES" -n "$NRANKS" --ntasks-per-node=8 --gpus-per-task=1 \
    --gpu-bind=closest -c 7 --cpu-bind=threads \
    python examples/vae/vae-ddp.py --epochs "$EPOCHS" --num-workers "$WORKERS" --loader "$LOADER" --comm torch
