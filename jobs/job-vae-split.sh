#!/bin/bash
# Frontier: the method-2 split. A core job step holds the dataset (vae_core_server.py) and a
# separate extra job step trains from it (vae_extra_train.py, DistDatasetReader); they meet in a
# handshake directory on the shared filesystem. The core stops when the STOP file appears.
#   VENV=~/envs/dd sbatch -A <project> jobs/job-vae-split.sh        # node 1: core (8 ranks); node 2: extra (8 ranks)
#SBATCH -J vae-split
#SBATCH -o vae-split-%j.out
#SBATCH -t 00:20:00
#SBATCH -p batch
#SBATCH -N 2
#SBATCH --gpus-per-node=8
# Separate steps reach each other over the job's VNI (job_vni); single_node_vni lets steps on one
# node talk as well.
#SBATCH --network=single_node_vni,job_vni

set -euo pipefail
module load PrgEnv-gnu
module load rocm/7.1.1
module load miniforge3
# The environment with torch, mpi4py and pyddstore: VENV=/path/to/env sbatch -A <project> jobs/job-vae-split.sh
: "${SLURM_JOB_ACCOUNT:?submit with an account: VENV=/path/to/env sbatch -A <project> jobs/job-vae-split.sh}"
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
N_CORE=8
N_EXTRA=8
if [ "$LOADER" = torch ]; then
    export DDSTORE_FORK_WORKERS=1    # memhooks instead of kdreg2 for forked workers
fi
export MIOPEN_USER_DB_PATH=/tmp/miopen-$USER-$SLURM_JOB_ID
export MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_USER_DB_PATH

# Shared filesystem, owner-only (pyddstore checks 0700/0600).
HS=${HS:-$MEMBERWORK/${SLURM_JOB_ACCOUNT:-$USER}/ddstore-hs-$SLURM_JOB_ID}
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

srun --overlap -N 1 -n "$N_CORE" -w "$CORE_NODE" --gpus-per-task=1 --gpu-bind=closest -c 7 \
    bash -c "$JOB_VNI_ONLY" task \
    python examples/vae/vae_core_server.py --handshake-dir "$HS" --gpu-source &
CORE=$!

# A stop file, not scancel: the core frees and withdraws its records.
stop_core() {
    touch "$HS/STOP"
    for _ in $(seq 60); do kill -0 "$CORE" 2>/dev/null || break; sleep 1; done
    kill "$CORE" 2>/dev/null || true
    wait "$CORE" || true
}
trap stop_core EXIT

export DDSTORE_N_CORE=$N_CORE
srun --overlap -N 1 -n "$N_EXTRA" -w "$EXTRA_NODE" --gpus-per-task=1 --gpu-bind=closest -c 7 \
    bash -c "$JOB_VNI_ONLY" task \
    python examples/vae/vae_extra_train.py --handshake-dir "$HS" --epochs "$EPOCHS" \
    --num-workers "$WORKERS" --loader "$LOADER" --gpu-dest
