#!/usr/bin/env bash
# The test command: installs what is missing, builds, then runs the Rust
# tests (cargo test) and the Python tests (pytest; multi-rank jobs run
# under mpirun and as plain processes joined through files).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
echo "==> cargo test"
cargo test --workspace --exclude pyddstore --quiet
# The binding's unit tests (its error mapping); no Python needed to run them.
cargo test -p pyddstore --lib --quiet
echo "==> pytest"
python -m pytest tests -q -x --durations=10 "$@"
