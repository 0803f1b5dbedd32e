#!/usr/bin/env bash
# The torch tests (those that use torch's private DataLoader API: the loaders, start methods,
# process workers) against one torch, in a venv of its own:
#   scripts/test-torch-min.sh            the oldest torch pyddstore supports (pyproject:
#                                        torch>=2.6), in .venv-torch-min; TORCH_MIN overrides it
#   scripts/test-torch-min.sh --latest   the newest torch on the index, in .venv-torch-latest
# The CPU wheel (about 200 MB), else PyPI's CUDA build (about 2.5 GB). Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${1:-}" = "--latest" ]; then
    shift
    VENV=.venv-torch-latest
    WANT=""  # the newest: upgraded on every run
else
    VENV=.venv-torch-min
    WANT=${TORCH_MIN:-2.6.0}
fi
if [ ! -x $VENV/bin/python ]; then
    $PY -m venv $VENV
fi
. $VENV/bin/activate
if [ -z "$WANT" ]; then
    python -m pip install -q --no-cache-dir -U torch --index-url https://download.pytorch.org/whl/cpu ||
        python -m pip install -q --no-cache-dir -U torch   # PyPI's (CUDA) build
else
    python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$WANT')" 2>/dev/null || \
        { python -m pip install -q --no-cache-dir "torch==$WANT" --index-url https://download.pytorch.org/whl/cpu ||
          python -m pip install -q --no-cache-dir "torch==$WANT"; }   # PyPI's (CUDA) build
fi
python -m pip install -q numpy mpi4py pytest tqdm maturin
maturin develop --release -q 2>&1 | grep -v "^$" | tail -n 2
python -c "import torch; print('torch', torch.__version__)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
python -m pytest -q -x tests/test_torch_unit.py tests/test_torch_loader.py tests/test_start_methods.py \
    tests/test_proc_loader.py "$@"
