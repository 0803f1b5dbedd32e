#!/usr/bin/env bash
# The torch tests against the oldest torch pyddstore supports (pyproject: torch>=2.6), in
# .venv-torch-min (the CPU wheel, about 200 MB, else PyPI's CUDA build, about 2.5 GB).
# TORCH_MIN overrides the version.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_MIN=${TORCH_MIN:-2.6.0}
PY=${PYTHON:-python3}
if [ ! -x .venv-torch-min/bin/python ]; then
    $PY -m venv .venv-torch-min
fi
. .venv-torch-min/bin/activate
python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_MIN')" 2>/dev/null || \
    { python -m pip install -q --no-cache-dir "torch==$TORCH_MIN" --index-url https://download.pytorch.org/whl/cpu ||
      python -m pip install -q --no-cache-dir "torch==$TORCH_MIN"; }   # PyPI's (CUDA) build
python -m pip install -q numpy mpi4py pytest tqdm maturin
maturin develop --release -q 2>&1 | grep -v "^$" | tail -n 2
python -c "import torch; print('torch', torch.__version__)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
python -m pytest -q -x tests/test_torch_unit.py tests/test_torch_loader.py tests/test_start_methods.py "$@"
