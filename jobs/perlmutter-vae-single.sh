#!/bin/bash
# Perlmutter: the DDP VAE as one job (method 1 over CXI), 4 GPUs per node, one per rank.
#   VENV=~/envs/dd sbatch -A <project> jobs/perlmutter-vae-single.sh
#   LOADER=torch WORKERS=4 sbatch -A <project> jobs/perlmutter-vae-single.sh    # forked DataLoader workers
#SBATCH -J vae-single
#SBATCH -o vae-single-%j.out
#SBATCH -C gpu
#SBATCH -q regular
#SBATCH -t 00:20:00
#SBATCH -N 2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH -c 32

set -euo pipefail
module load PrgEnv-gnu
module load cudatoolkit
module load python
# The environment with torch, mpi4py and pyddstore: VENV=/path/to/env sbatch -A <project> jobs/perlmutter-vae-single.sh
: "${SLURM_JOB_ACCOUNT:?submit with an account: VENV=/path/to/env sbatch -A <project> jobs/perlmutter-vae-single.sh}"
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
export MPICH_GPU_SUPPORT_ENABLED=0
LOADER=${LOADER:-thread}
WORKERS=${WORKERS:-1}
EPOCHS=${EPOCHS:-10}
if [ "$LOADER" = torch ]; then
    export DDSTORE_FORK_WORKERS=1     # Perlmutter's default monitor works too; this is harmless
fi

NRANKS=$((SLURM_JOB_NUM_NODES * 4))
srun -n "$NRANKS" --ntasks-per-node=4 --gpus-per-task=1 --gpu-bind=none -c 32 --cpu-bind=cores \
    python examples/vae/vae-ddp.py --epochs "$EPOCHS" --num-workers "$WORKERS" --loader "$LOADER" \
    --gpu-dest --gpu-source

# Without MPI: method 1 over the DDP (NCCL) group.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
DDSTORE_MPI=0 srun -n "$NRANKS" --ntasks-per-node=4 --gpus-per-task=1 --gpu-bind=none -c 32 \
    --cpu-bind=cores \
    python examples/vae/vae-ddp.py --epochs "$EPOCHS" --num-workers "$WORKERS" --loader "$LOADER" --comm torch
