#!/usr/bin/env bash
# The test command: installs what is missing, builds, lints (scripts/lint.sh), then runs the Rust
# tests (cargo test; the libfabric 2.3.1 build beside lint and it), and the Python tests (pytest;
# multi-rank jobs run under mpirun and as plain processes joined through files): both tiers (default
# and `slow`) in one pool of pytest workers, longest tests first, then the `serial` ones alone.
# Beside the pool, the torch tests against the oldest supported torch and the newest on the index
# (scripts/test-torch-min.sh).
#   TEST_WORKERS=N     pytest workers (default 4: the tests mostly wait, on sleeps, timeouts and
#                      process start-up, so 4 keep 2 cores busy; 0 = in this process)
#   TEST_TORCH_COMPAT=0  skip the oldest/newest torch phase (it downloads torch once per version)
# Arguments go to every pytest run, e.g. `bash scripts/run-tests.sh -k ragged`. One tier alone:
# `python -m pytest tests -m "not slow"` (or `-m slow`) in the activated .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's start, in minutes:seconds since this script began (the CI budget is 20 minutes), and
# the CPU time the finished steps used (user, system): a phase whose CPU grew less than twice its
# wall time left the 2 cores partly idle (waiting on sleeps, timeouts, process start-up, network).
mkdir -p target
stamp() {
    local f=target/.times.$BASHPID
    times >"$f"  # the builtin, in this shell (or the background one): its second line is the children's
    printf '[%d:%02d] %s (CPU %s)\n' $((SECONDS / 60)) $((SECONDS % 60)) "$1" "$(tail -n 1 "$f")"
    rm -f "$f"
}
stamp "setup"
bash scripts/setup.sh
. .venv/bin/activate
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
WORKERS=${TEST_WORKERS:-4}

# torch 2.6 and the newest torch, each in a venv kept in ~/.cache/pyddstore: installed in the
# background now (mostly download), tested beside the pytest pool (mostly waiting), reported at the end.
COMPAT=target/torch-compat
compat_pid=""
if [ "${TEST_TORCH_COMPAT:-1}" = 1 ]; then
    rm -rf $COMPAT
    mkdir -p $COMPAT
    export TORCH_VENV_HOME=${XDG_CACHE_HOME:-$HOME/.cache}/pyddstore
    set -m  # its own process group: stopped with everything it started if this script ends first
    (
        # When the newest torch on the index is the main venv's (scripts/constraints.txt), the pool
        # tests it: no venv of its own then.
        newest=$(python -m pip index versions torch 2>/dev/null | sed -n '1s/^torch (\(.*\))$/\1/p' || true)
        have=$(python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
        versions=(min)
        if [ "$newest" != "$have" ]; then versions+=(latest); fi
        echo "==> torch $have in .venv, ${newest:-?} the newest on the index: ${versions[*]} in $TORCH_VENV_HOME"
        for v in "${versions[@]}"; do
            flag=$([ "$v" = latest ] && echo --latest || true)
            stamp "torch $v: venv"
            bash scripts/test-torch-min.sh $flag --install-only
        done
        # The tests wait for the pytest pool to start (they would slow the builds before it).
        while [ ! -e $COMPAT/go ]; do sleep 2; done
        for v in "${versions[@]}"; do
            flag=$([ "$v" = latest ] && echo --latest || true)
            stamp "torch $v: tests"
            TEST_WORKERS=2 bash scripts/test-torch-min.sh $flag --test-only "$@"
        done
    ) </dev/null >$COMPAT/log 2>&1 &
    compat_pid=$!
    set +m
fi
# `background LOG CMD...`: CMD in the background, in its own process group (stopped with everything it
# started if this script ends first), its output in LOG; its pid in $bg_pid.
background() {
    local log=$1
    shift
    set -m
    "$@" </dev/null >"$log" 2>&1 &
    bg_pid=$!
    set +m
}
# `join PID LOG WHAT`: waits for a background job, prints its log, and ends this script if it failed.
join() {
    local rc=0
    wait "$1" || rc=$?
    cat "$2"
    [ "$rc" -eq 0 ] || { echo "$3 failed (log above: $2)" >&2; exit "$rc"; }
}
# libfabric 2.3.1 (Frontier's): built once into ~/.cache/pyddstore, then the fabric transport tests
# and the extension against it (its own cargo target dir), in the background beside lint and cargo
# test; its gather, stalled-owner and provider tests after them, alone (their owners are stopped for
# 5 s: beside the pytest pool a loaded reader timed out on another path) (scripts/test-libfabric2.sh).
LF2_LOG=target/libfabric2-build.log
background $LF2_LOG bash scripts/test-libfabric2.sh --build-only
lf2_pid=$bg_pid
# The background jobs end with this script, whichever way it ends.
stop_background() {
    local pid
    for pid in $compat_pid $lf2_pid; do kill -- -"$pid" 2>/dev/null || true; done
}
trap stop_background EXIT

stamp "lint"
bash scripts/lint.sh
stamp "cargo test"
echo "==> cargo test"
cargo test --workspace --exclude pyddstore --quiet
# The binding's unit tests (its error mapping, buffer claims): built without pyo3's
# extension-module, so they link the venv's libpython (found at run time through LIBDIR).
LD_LIBRARY_PATH=$(python -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    cargo test -p pyddstore --lib --quiet
stamp "libfabric 2.3.1 (built beside lint and cargo test, then its tests)"
join "$lf2_pid" $LF2_LOG "the libfabric 2.3.1 build or its transport tests"
lf2_pid=""
bash scripts/test-libfabric2.sh --test-only "$@"

# A run with nothing selected (pytest's exit status 5, e.g. after `-k`) is not a failure. Each run
# ends with the 25 slowest tests of each tier it ran (tests/conftest.py).
export DDSTORE_TEST_SLOWEST=25
run() {
    local rc=0
    python -m pytest tests -q -x "$@" || rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || exit "$rc"
}
[ -z "$compat_pid" ] || touch $COMPAT/go
stamp "pytest (both tiers, $WORKERS workers, longest first)"
# One test at a time to each worker, in the order tests/conftest.py gives (longest first), so the
# long tests start at once and the short ones fill the workers' gaps.
workers=()
[ "$WORKERS" = 0 ] || workers=(-n "$WORKERS" --dist load --maxschedchunk 1)
run -m "not serial" "${workers[@]}" "$@"
if [ -n "$compat_pid" ]; then
    stamp "torch 2.6 and newest (run beside the pool)"
    join "$compat_pid" $COMPAT/log "the torch compatibility tests"
    compat_pid=""
fi
# Host-wide state (other users, /dev/shm listings, namespaces): alone, after everything else.
stamp "serial tests"
run -m serial "$@"
stamp "done"
