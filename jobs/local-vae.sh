#!/usr/bin/env bash
# The VAE jobs on this machine with mpirun (what job-vae-single.sh and job-vae-split.sh do on
# Frontier): a single DDP job (method 1, one epoch), then the method-2 split: a core server job
# and a separate extra training job sharing a handshake directory. Exits non-zero if any fails.
#
#   bash jobs/local-vae.sh                      # libfabric tcp over loopback
#   DDSTORE_FABRIC=shm bash jobs/local-vae.sh   # libfabric shared memory
#   NP=4 EPOCHS=2 bash jobs/local-vae.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then
    . .venv/bin/activate
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo} FI_SOCKETS_IFACE=${FI_SOCKETS_IFACE:-lo}
export DDSTORE_FABRIC=${DDSTORE_FABRIC:-tcp}
export DDSTORE_QUIET=${DDSTORE_QUIET:-1} PYTHONUNBUFFERED=1
export DDSTORE_HANDSHAKE_TIMEOUT_S=${DDSTORE_HANDSHAKE_TIMEOUT_S:-300}
NP=${NP:-2}           # ranks of each job
EPOCHS=${EPOCHS:-3}
PY=${PYTHON:-python3}
MPIRUN=(mpirun -n "$NP" --bind-to none)

HS=$(mktemp -d "${TMPDIR:-/tmp}/vae-hs.XXXXXX")   # mode 0700: records are owner-only
CORE_PID=
cleanup() {
    if [ -n "$CORE_PID" ] && kill -0 "$CORE_PID" 2>/dev/null; then
        touch "$HS/STOP"
        sleep 2
        kill "$CORE_PID" 2>/dev/null || true
        wait "$CORE_PID" 2>/dev/null || true
    fi
    rm -rf "$HS"
}
trap cleanup EXIT

echo "== single job: method 1 ($DDSTORE_FABRIC), $NP ranks, 1 worker thread"
DDSTORE_METHOD=1 timeout 300 "${MPIRUN[@]}" "$PY" examples/vae/vae-ddp.py --epochs "$EPOCHS" --num-workers 1

echo "== method-2 split: core server ($NP ranks) + extra job ($NP ranks)"
timeout 300 "${MPIRUN[@]}" "$PY" examples/vae/vae_core_server.py --handshake-dir "$HS" &
CORE_PID=$!
DDSTORE_N_CORE=$NP timeout 300 "${MPIRUN[@]}" "$PY" examples/vae/vae_extra_train.py \
    --handshake-dir "$HS" --epochs "$EPOCHS" --num-workers 1
touch "$HS/STOP"
wait "$CORE_PID"
CORE_PID=
for f in "$HS"/*.ddstore.json; do
    if [ -e "$f" ]; then
        echo "error: the core server left its record $f" >&2
        exit 1
    fi
done
echo "== local VAE jobs ok"
