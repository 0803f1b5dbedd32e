#!/usr/bin/env bash
# The requeue recipe (examples/requeue/train.py) on this machine with mpirun, as the Slurm jobs
# do it: an uninterrupted reference run, then the same training interrupted twice: a kill -9 of
# a rank at a random step (no checkpoint: back to the last one), and a simulated time limit
# (SIGUSR1 to mpirun, as Slurm's --signal=B:USR1@120 reaches the job script): checkpoint, exit,
# requeue. Each restart restores the dataset from the snapshot the first start saved. At the
# end the interrupted run's (epoch, batch, sample ids) sequence and weights must equal the
# reference's. Exits non-zero otherwise.
#
#   bash jobs/local-requeue.sh
#   NP=3 EPOCHS=2 SAMPLES=20000 KILL_STEP=17 bash jobs/local-requeue.sh
#   WORK=/tmp/rq KEEP=1 bash jobs/local-requeue.sh         # keep the work directory
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then
    # shellcheck disable=SC1091  # the project's venv, made by scripts/setup.sh
    . .venv/bin/activate
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo} FI_SOCKETS_IFACE=${FI_SOCKETS_IFACE:-lo}
export DDSTORE_QUIET=${DDSTORE_QUIET:-1} PYTHONUNBUFFERED=1
NP=${NP:-2}
EPOCHS=${EPOCHS:-2}
SAMPLES=${SAMPLES:-1000}
BATCH=${BATCH:-16}
EVERY=${EVERY:-7}                    # steps between checkpoints
PY=${PYTHON:-python3}
STEPS=$(( EPOCHS * (((SAMPLES + NP - 1) / NP + BATCH - 1) / BATCH) ))
KILL_STEP=${KILL_STEP:-$(( RANDOM % (STEPS / 2) + 1 ))}    # in the first half
SIGNAL_STEP=${SIGNAL_STEP:-$(( (STEPS * 2) / 3 ))}        # lines of steps.r0.jsonl
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/requeue.XXXXXX")}
if [ "${KEEP:-0}" != 1 ]; then
    trap 'rm -rf "$WORK"' EXIT
fi
TRAIN=("$PY" examples/requeue/train.py --samples "$SAMPLES" --epochs "$EPOCHS" --batch-size "$BATCH"
       --checkpoint-every "$EVERY")
MPIRUN=(mpirun -n "$NP" --bind-to none)

echo "== reference: $NP ranks, $EPOCHS epochs, $STEPS steps, uninterrupted"
timeout 300 "${MPIRUN[@]}" "${TRAIN[@]}" --work "$WORK/ref"

echo "== start 1: rank 0 is killed with SIGKILL at step $KILL_STEP"
if timeout 300 "${MPIRUN[@]}" "${TRAIN[@]}" --work "$WORK/run" --die-at-step "$KILL_STEP"; then
    echo "error: the job was not killed" >&2
    exit 1
fi

echo "== start 2 (requeued): the time limit's warning signal at step $SIGNAL_STEP"
"${MPIRUN[@]}" "${TRAIN[@]}" --work "$WORK/run" --step-delay 0.2 &
JOB=$!    # mpirun itself (not under timeout, which SIGUSR1 would end): it passes SIGUSR1 on
lines() { if [ -f "$WORK/run/steps.r0.jsonl" ]; then wc -l < "$WORK/run/steps.r0.jsonl"; else echo 0; fi; }
deadline=$((SECONDS + 300))
while kill -0 "$JOB" 2>/dev/null && [ "$(lines)" -lt "$SIGNAL_STEP" ] && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 0.2
done
kill -USR1 "$JOB" 2>/dev/null || true
while kill -0 "$JOB" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 0.2
done
if kill -0 "$JOB" 2>/dev/null; then
    kill -KILL "$JOB"
    echo "error: start 2 did not stop within 300 s of its start" >&2
    exit 1
fi
wait "$JOB"
if [ -e "$WORK/run/DONE" ]; then
    echo "error: the job finished before the signal" >&2
    exit 1
fi

echo "== start 3 (requeued): to the end"
timeout 300 "${MPIRUN[@]}" "${TRAIN[@]}" --work "$WORK/run"

for ((r = 0; r < NP; r++)); do
    cmp "$WORK/ref/steps.r$r.jsonl" "$WORK/run/steps.r$r.jsonl"
done
cmp "$WORK/ref/DONE" "$WORK/run/DONE"
echo "requeue-compare ok: $STEPS steps on $NP ranks, killed at step $KILL_STEP, signalled at $SIGNAL_STEP"
