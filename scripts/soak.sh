#!/usr/bin/env bash
# Long soak: 4 ranks read random rows of every rank through
# PyDDStore.get_batch from 2 threads each, verifying every byte, until each
# rank has read ROWS rows; fails on any mismatch, RSS growth of 5% or more
# after warm-up, or growth of 8 bytes or more per row read in the second
# half. Configurations: method 0 through MPI_Get (DDSTORE_SHM=0),
# method 0 and method 1 through same-node shared memory (DDSTORE_SHM=1, the
# default), method 1 over libfabric tcp (DDSTORE_SHM=0).
#
#   bash scripts/soak.sh [ROWS per rank, default 1000000] [RANKS, default 4]
#
# Then the same configurations through the PyTorch API: a DistDataset read by
# a shuffling ThreadDataLoader (tests/scripts/rel_soak_torch.py).
set -euo pipefail
cd "$(dirname "$0")/.."
rows="${1:-1000000}"
ranks="${2:-4}"
py="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || command -v python3 )}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo DDSTORE_QUIET=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/tests/scripts${PYTHONPATH:+:$PYTHONPATH}"

configs=(
  "method0-mpi-get 0 DDSTORE_SHM=0"
  "method0-shm 0 DDSTORE_SHM=1"
  "method1-tcp 1 DDSTORE_SHM=0 DDSTORE_FABRIC=tcp"
  "method1-shm-path 1 DDSTORE_SHM=1 DDSTORE_FABRIC=tcp"
)
failed=0
for script in rel_soak.py rel_soak_torch.py; do
for cfg in "${configs[@]}"; do
  read -r label method settings <<<"$cfg"
  [[ $script == rel_soak_torch.py ]] && label="torch-$label"
  start=$SECONDS
  if out=$(env $settings mpirun -n "$ranks" --bind-to none "$py" "tests/scripts/$script" "$method" "$rows" 2>&1); then
    status=ok
  else
    status=FAILED
    failed=1
  fi
  echo "== $label: $status in $((SECONDS - start)) s"
  python3 -c '
import json, re, sys
# Every "soak {...}" / "soak-torch {...}" report (ranks can share a line under mpirun).
text, decoder = sys.stdin.read(), json.JSONDecoder()
fmt = "  rank {rank}: {rows} rows, {rows_per_s} rows/s, {mismatches} mismatches, RSS {rss_warm_kib} -> {rss_end_kib} KiB ({rss_growth:+.2%})"
for m in re.finditer(r"soak(?:-torch)? [{]", text):
    r = decoder.raw_decode(text, m.end() - 1)[0]
    late = r.get("rss_late_bytes_per_row")
    print(fmt.format(**r) + ("" if late is None else f", {late} B/row in the second half"))
' <<<"$out" || true
  [[ $status == ok ]] || tail -30 <<<"$out"
done
done
exit $failed
