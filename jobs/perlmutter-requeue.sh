#!/bin/bash
# Perlmutter: the requeue recipe (examples/requeue/train.py, docs/guides/restarting.md). The first
# start loads the dataset and saves a snapshot on $PSCRATCH; checkpoints go to $WORK every N steps
# and when Slurm's warning signal arrives 120 s before the time limit; the job then requeues
# itself, and every later start restores the snapshot and the loader state.
#   VENV=~/envs/dd sbatch -A <project> jobs/perlmutter-requeue.sh
#   VENV=~/envs/dd WORK=$PSCRATCH/rq sbatch -A <project> jobs/perlmutter-requeue.sh
#SBATCH -J requeue
#SBATCH -o requeue-%j.out
#SBATCH --open-mode=append
#SBATCH -t 00:30:00
#SBATCH -C gpu
#SBATCH -q regular
#SBATCH -N 2
#SBATCH --signal=B:USR1@120
#SBATCH --requeue

set -euo pipefail
module load PrgEnv-gnu
module load cudatoolkit
module load python
# The environment with torch (CUDA), mpi4py and pyddstore: VENV=/path/to/env sbatch -A <project> jobs/perlmutter-requeue.sh
: "${SLURM_JOB_ACCOUNT:?submit with an account: VENV=/path/to/env sbatch -A <project> jobs/perlmutter-requeue.sh}"
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
# Checkpoints and the snapshot must outlive the allocation: a parallel file system, not the
# node-local /tmp (wiped when the job ends, and a requeue gets new nodes).
WORK=${WORK:-${PSCRATCH:-$PWD}/requeue-${SLURM_JOB_NAME}}
mkdir -p "$WORK"
NRANKS=$((SLURM_JOB_NUM_NODES * 4))
echo "start $(date -u +%FT%TZ): job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}, work $WORK"

srun -N "$SLURM_JOB_NUM_NODES" -n "$NRANKS" --ntasks-per-node=4 -c 32 --cpu-bind=cores \
    python examples/requeue/train.py --work "$WORK" --epochs "${EPOCHS:-10}" \
    --checkpoint-every "${CHECKPOINT_EVERY:-200}" &
SRUN=$!
# The warning signal reaches this script (B:); srun passes it on to every rank.
trap 'echo "time limit near: checkpointing"; kill -USR1 "$SRUN"' USR1
rc=0
wait "$SRUN" || rc=$?
while kill -0 "$SRUN" 2>/dev/null; do   # wait returned early for the trap: wait for the ranks
    rc=0
    wait "$SRUN" || rc=$?
done
if [ -e "$WORK/DONE" ]; then
    echo "training done"
elif [ "$rc" -eq 0 ]; then
    echo "checkpointed: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
else
    echo "error: training exited with $rc (its last checkpoint is in $WORK)" >&2
    exit "$rc"
fi
