#!/usr/bin/env bash
# Time from process start to the first batch on this machine: a first start (the dataset loaded
# from its source, then saved as a snapshot) against a restart (restored from that snapshot), for
# both sources of examples/requeue/train.py: per-sample decoding in Python, and rows read
# natively from a file (np.memmap). Each round starts over from the source (the raw file is kept).
#
#   bash jobs/local-restart-times.sh
#   NP=2 SAMPLES=200000 FEATURES=256 ROUNDS=3 bash jobs/local-restart-times.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then
    # shellcheck disable=SC1091  # the project's venv, made by scripts/setup.sh
    . .venv/bin/activate
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo} FI_SOCKETS_IFACE=${FI_SOCKETS_IFACE:-lo}
export DDSTORE_QUIET=1 PYTHONUNBUFFERED=1
NP=${NP:-2}
SAMPLES=${SAMPLES:-200000}
FEATURES=${FEATURES:-256}
ROUNDS=${ROUNDS:-3}
PY=${PYTHON:-python3}
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/restart-times.XXXXXX")}
trap 'rm -rf "$WORK"' EXIT

echo "# $NP ranks, $SAMPLES samples x $FEATURES int32 features ($(( SAMPLES * (FEATURES + 2) * 4 / 1000000 )) MB)"
echo "# source mode data_s save_s ready_s first_batch_s   (rank 0; *_s: seconds since process start)"
for ((round = 1; round <= ROUNDS; round++)); do
    for source in python memmap; do
        dir="$WORK/$source"
        rm -rf "$dir/snapshot" "$dir"/ckpt-* "$dir/latest.json" "$dir"/steps.r*.jsonl
        for _ in first restart; do  # the first start loads and saves, the restart restores
            timeout 600 mpirun -n "$NP" --bind-to none "$PY" examples/requeue/train.py --work "$dir" \
                --source "$source" --samples "$SAMPLES" --features "$FEATURES" --max-steps 1 \
                | "$PY" -c '
import json, sys
for line in sys.stdin:
    if line.startswith("requeue-start"):
        r = json.loads(line.split(" ", 1)[1])
        if r["rank"] == 0:
            print(r["source"], r["mode"], r["data_s"], r["save_s"], r["ready_s"], r["first_batch_s"])
'
        done
    done
done
