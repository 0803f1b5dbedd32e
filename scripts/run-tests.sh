#!/usr/bin/env bash
# The test command: installs what is missing, builds, lints (scripts/lint.sh),
# then runs the Rust tests (cargo test) and the Python tests (pytest; multi-rank
# jobs run under mpirun and as plain processes joined through files) in two
# tiers: the default one first, then the slow one (`-m slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's start, in minutes:seconds since this script began (the CI budget is 20 minutes).
stamp() { printf '[%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$1"; }
stamp "setup"
bash scripts/setup.sh
. .venv/bin/activate
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
stamp "lint"
bash scripts/lint.sh
stamp "cargo test"
echo "==> cargo test"
cargo test --workspace --exclude pyddstore --quiet
# The binding's unit tests (its error mapping, buffer claims): built without pyo3's
# extension-module, so they link the venv's libpython (found at run time through LIBDIR).
LD_LIBRARY_PATH=$(python -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    cargo test -p pyddstore --lib --quiet
# libfabric 2.3.1 (Frontier's): built once into ~/.cache/pyddstore, then the fabric transport,
# gather, stalled-owner and provider tests against it (scripts/test-libfabric2.sh).
stamp "libfabric 2.3.1"
bash scripts/test-libfabric2.sh "$@"
# A tier with nothing selected (pytest's exit status 5, e.g. after `-k`) is not a failure.
# Each tier runs on TEST_WORKERS pytest workers (pytest-xdist; 0 = in this process), then
# its `serial` tests (host-wide state: other users, /dev/shm listings, namespaces) alone.
WORKERS=${TEST_WORKERS:-2}
run() {
    local rc=0
    python -m pytest tests -q -x --durations=25 "$@" || rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || exit "$rc"
}
tier() {
    local marks=$1
    shift
    # worksteal: an idle worker takes queued tests from a busy one, so a long test near the
    # end of one worker's share does not leave the other core idle.
    run -m "$marks and not serial" -n "$WORKERS" --dist worksteal "$@"
    stamp "serial tests"
    run -m "$marks and serial" "$@"
}
stamp "pytest (default tier)"
tier "not slow" "$@"
stamp "pytest (slow tier)"
tier "slow" "$@"
stamp "done"
