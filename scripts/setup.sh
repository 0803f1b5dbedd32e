#!/usr/bin/env bash
# Installs everything pyddstore needs on a fresh Debian machine (as root, or
# with sudo), then builds the extension into ./.venv. Safe to run again:
# steps already done are skipped.
#   WITH_TORCH=0  skip PyTorch and torch_geometric (2.8 GB download; needed for pyddstore.torch)
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

APT_PACKAGES="libopenmpi-dev openmpi-bin libfabric-dev libfabric-bin libclang-dev clang pkg-config python3-venv valgrind iproute2 shellcheck"
# autotools: the libfabric 2.3.1 phase of the test command builds libfabric from source (autogen.sh)
APT_PACKAGES="$APT_PACKAGES autoconf automake libtool"
missing=""
for p in $APT_PACKAGES; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "==> apt-get install$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || { echo "cargo not found: install a Rust toolchain (rustup) first" >&2; exit 1; }

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "==> python venv .venv"
    $PY -m venv .venv
fi
. .venv/bin/activate

want="numpy mpi4py maturin pytest xdist ruff matplotlib h5py zarr tqdm mkdocs material mkdocstrings mkdocstrings_handlers.python"
# torch_geometric: the graph tests and examples/gnn (pure Python; the `graph` extra)
[ "${WITH_TORCH:-1}" = "1" ] && want="$want torch torch_geometric"
# torchdata: StatefulDataLoader resume tests (the `torchdata` extra)
[ "${WITH_TORCH:-1}" = "1" ] && want="$want torchdata"
need=""
for p in $want; do
    python -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('$p') is None)" 2>/dev/null || need="$need $p"
done
# The extension is built from these; `.venv/.pyddstore-built` is newer than all of them after a build.
stamp=.venv/.pyddstore-built
sources=(Cargo.toml Cargo.lock pyproject.toml ddstore-core ddstore-fabric pyddstore/Cargo.toml pyddstore/src)
built_since_sources() { [ -f "$stamp" ] && [ -z "$(find "${sources[@]}" -newer "$stamp" -print -quit)" ]; }
build_pid=""
if [ -n "$need" ]; then
    echo "==> pip install$need"
    python -m pip install -q --no-cache-dir --upgrade pip >/dev/null
    if ! built_since_sources; then
        # The Rust build (CPU) beside the downloads below (network): maturin first, then the
        # extension built in place in the background; `maturin develop` below finds it built.
        python -m pip install -q --no-cache-dir -c scripts/constraints.txt maturin
        touch "$stamp.new"
        maturin develop --release --skip-install -q >.venv/.pyddstore-build.log 2>&1 &
        build_pid=$!
    fi
    # import names -> pip names (the docs toolchain: mkdocs-material + mkdocstrings)
    need=$(echo "$need" | sed -e 's/ xdist/ pytest-xdist/' -e 's/ material/ mkdocs-material/' -e 's/ mkdocstrings_handlers.python/ mkdocstrings-python/')
    python -m pip install -q --no-cache-dir -c scripts/constraints.txt $need   # the versions CI was green with
fi

# `maturin develop` reinstalls the package (its .pth and entry point go away for a moment), which
# breaks a pyddstore that another process imports then (tests beside `make demo`): skipped when the
# installed build is newer than every file it is built from (`rm .venv/.pyddstore-built` forces it).
if [ -n "$build_pid" ]; then
    wait "$build_pid" || { cat .venv/.pyddstore-build.log >&2; exit 1; }
fi
if built_since_sources && python -c "import pyddstore._native" 2>/dev/null; then
    echo "==> the extension is up to date (built $(date -r "$stamp" '+%F %T'))"
else
    echo "==> building the extension (maturin develop --release)"
    [ -f "$stamp.new" ] || touch "$stamp.new"
    maturin develop --release -q 2>&1 | grep -v "^$" | tail -n 3
    mv "$stamp.new" "$stamp"
fi
python -c "import pyddstore; print('pyddstore', pyddstore.__version__, 'ready')"
