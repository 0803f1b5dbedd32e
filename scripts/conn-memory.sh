#!/usr/bin/env bash
# Bytes and descriptors per connection of tcp;ofi_rxm, below pyddstore (issue 35): one endpoint
# connected to M others over loopback, its RSS growth per peer (scripts/conn_memory.c).
#   bash scripts/conn-memory.sh out 200 [VAR=VALUE ...]   connections the hub opens
#   bash scripts/conn-memory.sh in 200 [VAR=VALUE ...]    connections it accepts, then answers over
#                                                         (completes with libfabric 1.17 only)
#   LIBFABRIC_HOME=...  another libfabric (e.g. the 2.3.1 of scripts/test-libfabric2.sh's cache)
# The variables go to both processes; pyddstore's defaults for tcp are set here as a store would.
set -euo pipefail
mode=${1:-out}
peers=${2:-200}
shift 2 || true
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
flags=(-lfabric)
if [ -n "${LIBFABRIC_HOME:-}" ]; then
    flags=(-I"$LIBFABRIC_HOME/include" -L"$LIBFABRIC_HOME/lib" "-Wl,-rpath=$LIBFABRIC_HOME/lib" -lfabric)
fi
cc -O1 -o "$dir/conn_memory" "$(dirname "$0")/conn_memory.c" "${flags[@]}"
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo} FI_PROVIDER='tcp;ofi_rxm'
export FI_UNIVERSE_SIZE=16 FI_OFI_RXM_BUFFER_SIZE=1024 FI_TCP_MAX_RX_SIZE=1024
for setting in "$@"; do export "${setting?}"; done
if [ "$mode" = in ]; then
    "$dir/conn_memory" spokes "$peers" "$dir" &
    "$dir/conn_memory" hub "$peers" "$dir"
else
    "$dir/conn_memory" sinks "$peers" "$dir" &
    "$dir/conn_memory" hubout "$peers" "$dir"
fi
wait
