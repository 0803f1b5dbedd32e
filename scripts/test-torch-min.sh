#!/usr/bin/env bash
# The torch tests (those that use torch's private DataLoader API, pyddstore/torch/_torch_compat.py:
# the loaders, get_worker_info per thread, samplers, start methods, process workers) against one
# torch, in a venv of its own (`make test-torch-min`, `make test-torch-latest`, and a background
# phase of the test command, scripts/run-tests.sh):
#   scripts/test-torch-min.sh            the oldest torch pyddstore supports (pyproject:
#                                        torch>=2.6), in .venv-torch-min; TORCH_MIN overrides it
#   scripts/test-torch-min.sh --latest   the newest torch on the index, in .venv-torch-latest
#   --install-only / --test-only         only the venv / only the tests (run-tests.sh installs
#                                        while it lints and builds, and tests beside its pytest phase)
# The CPU wheel (about 200 MB), else PyPI's (CUDA) build. The extension is the checkout's own
# (abi3: built once by scripts/setup.sh, found through PYTHONPATH), not rebuilt here. Further
# arguments go to pytest (TEST_WORKERS: its workers, default 2; 0 = in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Where the venvs live: the checkout (make), or ~/.cache/pyddstore (run-tests.sh: kept across clones).
HOME_DIR=${TORCH_VENV_HOME:-$PWD}
VENV=$HOME_DIR/.venv-torch-min
WANT=${TORCH_MIN:-2.6.0}
install=1 test=1
while [ $# -gt 0 ]; do
    case $1 in
        --latest) VENV=$HOME_DIR/.venv-torch-latest WANT="" ;;  # the newest: upgraded on every run
        --install-only) test=0 ;;
        --test-only) install=0 ;;
        *) break ;;
    esac
    shift
done
CPU_INDEX=https://download.pytorch.org/whl/cpu
pip_install() { python -m pip install -q --progress-bar off "$@"; }
if [ "$install" = 1 ]; then
    mkdir -p "$HOME_DIR"
    exec 9>"$VENV.lock"
    flock 9  # one install at a time into this venv (concurrent test commands share it)
    [ -x "$VENV"/bin/python ] || $PY -m venv "$VENV"
    . "$VENV"/bin/activate
    if [ -z "$WANT" ]; then
        pip_install --no-cache-dir --retries 1 -U torch --index-url $CPU_INDEX || pip_install --no-cache-dir -U torch
    else
        python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$WANT')" 2>/dev/null ||
            pip_install --no-cache-dir --retries 1 "torch==$WANT" --index-url $CPU_INDEX ||
            pip_install --no-cache-dir "torch==$WANT"
    fi
    # The rest at the versions the main venv has (scripts/constraints.txt).
    pip_install -c scripts/constraints.txt numpy mpi4py pytest pytest-xdist tqdm
    deactivate
    flock -u 9
fi
[ "$test" = 1 ] || exit 0
[ -x "$VENV"/bin/python ] || { echo "$VENV missing: run $0 without --test-only" >&2; exit 1; }
. "$VENV"/bin/activate
ls pyddstore/python/pyddstore/_native*.so >/dev/null 2>&1 ||
    { echo "the extension is not built: run scripts/setup.sh first" >&2; exit 1; }
export PYTHONPATH=$PWD/pyddstore/python${PYTHONPATH:+:$PYTHONPATH}
python -c "import torch, pyddstore; print('torch', torch.__version__, 'pyddstore from', pyddstore.__file__)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
workers=()
[ "${TEST_WORKERS:-2}" = 0 ] || workers=(-n "${TEST_WORKERS:-2}")
rc=0
python -m pytest -q -p no:cacheprovider "${workers[@]}" -m "not slow and not serial" tests/test_torch_unit.py \
    tests/test_torch_loader.py tests/test_start_methods.py tests/test_proc_loader.py "$@" || rc=$?
# Nothing selected (pytest's 5, e.g. after the test command's `-k`) is not a failure.
[ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || exit "$rc"
