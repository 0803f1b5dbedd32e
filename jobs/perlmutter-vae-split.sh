#!/bin/bash
# Perlmutter: the method-2 split. Core step (vae_core_server.py) on the first node, extra
# training step (vae_extra_train.py) on the second; they meet in a handshake directory on $SCRATCH.
#   VENV=~/envs/dd sbatch -A <project> jobs/perlmutter-vae-split.sh
#SBATCH -J vae-split
#SBATCH -o vae-split-%j.out
#SBATCH -C gpu
#SBATCH -q regular
#SBATCH -t 00:20:00
#SBATCH -N 2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH -c 32
#SBATCH --network=job_vni

set -euo pipefail
module load PrgEnv-gnu
module load cudatoolkit
module load python
# The environment with torch, mpi4py and pyddstore: VENV=/path/to/env sbatch -A <project> jobs/perlmutter-vae-split.sh
: "${SLURM_JOB_ACCOUNT:?submit with an account: VENV=/path/to/env sbatch -A <project> jobs/perlmutter-vae-split.sh}"
: "${VENV:?set VENV to the virtual or conda environment with torch, mpi4py and pyddstore}"
if [ -f "$VENV/bin/activate" ]; then
    # shellcheck disable=SC1091  # the user's environment, not in this repository
    . "$VENV/bin/activate"
else
    export PATH="$VENV/bin:$PATH"    # a conda prefix
fi

cd "${SLURM_SUBMIT_DIR:-.}"
export DDSTORE_FABRIC=cxi
export DDSTORE_QUIET=1
export DDSTORE_HANDSHAKE_TIMEOUT_S=600
LOADER=${LOADER:-thread}
WORKERS=${WORKERS:-1}
EPOCHS=${EPOCHS:-10}
N_CORE=4
N_EXTRA=4
if [ "$LOADER" = torch ]; then
    export DDSTORE_FORK_WORKERS=1
fi

HS=${HS:-$SCRATCH/ddstore-hs-$SLURM_JOB_ID}
mkdir -p "$(dirname "$HS")"
[ -d "$HS" ] || mkdir -m 700 "$HS"
rm -f "$HS/STOP"

# libfabric's cxi provider uses the first VNI in SLINGSHOT_VNIS. With job_vni each step gets
# SLINGSHOT_VNIS=<step VNI>,<job VNI>; only the job VNI is shared between steps, so every task
# keeps just the last one. Slurm sets the variable per task, hence the trim inside the task.
# The network option stays at the job level (#SBATCH): --network on srun can drop the job VNI.
# shellcheck disable=SC2016  # expanded by the task's shell, not here
JOB_VNI_ONLY='export SLINGSHOT_VNIS=${SLINGSHOT_VNIS##*,}; exec "$@"'

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
CORE_NODE=${NODES[0]}
EXTRA_NODE=${NODES[1]:-${NODES[0]}}

srun --overlap -N 1 -n "$N_CORE" -w "$CORE_NODE" --gpus-per-task=1 --gpu-bind=none -c 32 \
    bash -c "$JOB_VNI_ONLY" task \
    python examples/vae/vae_core_server.py --handshake-dir "$HS" --gpu-source &
CORE=$!

stop_core() {
    touch "$HS/STOP"
    for _ in $(seq 60); do kill -0 "$CORE" 2>/dev/null || break; sleep 1; done
    kill "$CORE" 2>/dev/null || true
    wait "$CORE" || true
}
trap stop_core EXIT

export DDSTORE_N_CORE=$N_CORE
srun --overlap -N 1 -n "$N_EXTRA" -w "$EXTRA_NODE" --gpus-per-task=1 --gpu-bind=none -c 32 \
    bash -c "$JOB_VNI_ONLY" task \
    python examples/vae/vae_extra_train.py --handshake-dir "$HS" --epochs "$EPOCHS" \
    --num-workers "$WORKERS" --loader "$LOADER" --gpu-dest
