#!/usr/bin/env bash
# The main job on one machine: installs what is missing, builds, then runs
# the 4-rank demo (loads a dataset into the store, random batched reads
# across ranks, verified, figures printed) and the VAE example.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh  # make demo: done by $(SETUP) already
. .venv/bin/activate
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
mpirun -n 4 --bind-to none python examples/scripts/demo.py "$@"
if [ -f jobs/local-vae.sh ]; then
    bash jobs/local-vae.sh
fi
