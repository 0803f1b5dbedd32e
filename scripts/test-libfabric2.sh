#!/usr/bin/env bash
# pyddstore against libfabric 2.x (Frontier ships 2.3.1; the system's here is 1.17): a phase of the
# test command (scripts/run-tests.sh) and `make test-libfabric2`.
#  1. libfabric from the vendored tarball (third_party/), built once (tcp, rxm, shm and sockets
#     providers) into a cache outside the checkout, keyed by the tarball's hash: later runs, and
#     other clones, reuse it.
#  2. pyddstore against it in target/libfabric2 (the checkout's own build is untouched): one cargo
#     target dir, seeded from target/release, for the fabric transport tests and the extension.
#  3. The fabric transport tests (cargo), then the gather, stalled-owner and provider tests
#     (pytest, tcp and shm) with that extension.
#   LIBFABRIC2_TARBALL  the source tarball (default third_party/libfabric-2.3.1-src.tar.gz)
#   LIBFABRIC2_CACHE    where built libfabrics are kept (default ${XDG_CACHE_HOME:-~/.cache}/pyddstore)
#   LIBFABRIC2_FULL=1   also compare the bindings regenerated from its headers with the committed
#                       ones, run the slow gather tests and the method-1 tests of test_store.py
#                       (`make test-libfabric2`)
#   TEST_WORKERS        pytest workers (default 2; 0 = in this process)
# --build-only: steps 1-3 up to the extension (the test command runs them beside its lint and cargo
# test); --test-only: the pytest step alone, with the extension a --build-only run left. Other
# arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
part=all
case "${1:-}" in --build-only | --test-only) part=${1#--}; shift ;; esac
ROOT=$PWD
started=$SECONDS
# Seconds since the phase began, before each step.
step() { echo "==> [$((SECONDS - started)) s] $1"; }
TARBALL=${LIBFABRIC2_TARBALL:-$ROOT/third_party/libfabric-2.3.1-src.tar.gz}
WORK=$ROOT/target/libfabric2
[ -f "$TARBALL" ] || { echo "no libfabric source tarball at $TARBALL: set LIBFABRIC2_TARBALL" >&2; exit 1; }
for tool in autoconf automake libtoolize flock; do
    command -v $tool >/dev/null || { echo "$tool not found: run scripts/setup.sh (apt-get install autoconf automake libtool)" >&2; exit 1; }
done
. .venv/bin/activate

# 1. libfabric, once per tarball (a lock keeps concurrent runs from building it twice).
name=$(basename "$TARBALL" .tar.gz)
name=${name%-src}
hash=$(sha256sum "$TARBALL" | cut -c1-16)
CACHE=${LIBFABRIC2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pyddstore}
BUILT=$CACHE/$name-$hash
PREFIX=$BUILT/prefix
mkdir -p "$CACHE"
(
    flock 9
    [ -f "$PREFIX/.complete" ] && exit 0
    step "building $name from $TARBALL into $PREFIX (autogen, configure, make; once)"
    rm -rf "$BUILT"
    mkdir -p "$BUILT/src"
    tar xzf "$TARBALL" -C "$BUILT/src" --strip-components=1
    cd "$BUILT/src"
    { [ -x configure ] || ./autogen.sh >"$BUILT/autogen.log" 2>&1; } &&
        ./configure --prefix="$PREFIX" --disable-static --enable-only \
            --enable-tcp --enable-rxm --enable-shm --enable-sockets >"$BUILT/configure.log" 2>&1 &&
        make -j"$(nproc)" >"$BUILT/make.log" 2>&1 &&
        make install >"$BUILT/install.log" 2>&1 ||
        { echo "libfabric build failed: see $BUILT/*.log" >&2; exit 1; }
    rm -rf "$BUILT/src"
    touch "$PREFIX/.complete"
) 9>"$BUILT.lock"
export LIBFABRIC_HOME=$PREFIX
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
export LD_LIBRARY_PATH=$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CARGO_TARGET_DIR=$WORK/cargo
version=$(pkg-config --modversion libfabric)
SITE=$WORK/site
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
if [ "$part" != test-only ]; then
step "libfabric $version from $PREFIX, providers: $("$PREFIX/bin/fi_info" -l | grep -v version | tr -d ':' | tr '\n' ' ')"

# 2. The committed bindings against these headers: every item pyddstore uses must be the same.
if [ "${LIBFABRIC2_FULL:-0}" = 1 ]; then
    step "bindings: regenerated from libfabric $version headers, compared with src/bindings.rs"
    cargo build -q -p libfabric-sys --features bindgen
    generated=$(ls -t "$CARGO_TARGET_DIR"/debug/build/libfabric-sys-*/out/bindings.rs | head -n 1)
    python scripts/compare_bindings.py ddstore-fabric/libfabric-sys/src/bindings.rs "$generated" \
        ddstore-fabric
fi

# 3. The fabric transport tests (file communicator, tcp;ofi_rxm, shm, sockets) against it, and the
# extension, in one target dir: only libfabric-sys and what depends on it rebuild from the seed.
if [ ! -d "$CARGO_TARGET_DIR/release" ] && [ -d target/release ]; then
    mkdir -p "$CARGO_TARGET_DIR"
    cp -a target/release "$CARGO_TARGET_DIR/"
fi
step "cargo test -p ddstore-fabric --test ofi_transport (libfabric $version)"
cargo test -q --release -p ddstore-fabric --test ofi_transport
step "pyddstore against libfabric $version"
cargo build -q --release -p pyddstore --features pyo3/extension-module
rm -rf "$SITE"
mkdir -p "$SITE"
cp -r pyddstore/python/pyddstore "$SITE/"
find "$SITE" -name '*.so' -delete
cp "$CARGO_TARGET_DIR/release/lib_native.so" "$SITE/pyddstore/_native.abi3.so"
fi
[ "$part" != build-only ] || { echo "libfabric $version: built, transport tests passed in $((SECONDS - started)) s"; exit 0; }
[ -f "$SITE/pyddstore/_native.abi3.so" ] || { echo "no libfabric-2 build in $SITE: run with --build-only first" >&2; exit 1; }
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
python - "$version" "$SITE" "$PREFIX" <<'EOF'
import sys
import pyddstore, pyddstore._native as native
want, site, prefix = sys.argv[1:4]
assert pyddstore.__file__.startswith(site), f"imported {pyddstore.__file__}, not the libfabric-2 build"
got = native.system_info()["libfabric_version"]  # major.minor, from fi_version()
assert want.startswith(got + "."), f"the extension runs against libfabric {got}, not {want}"
maps = [line.split()[-1] for line in open("/proc/self/maps") if "libfabric.so" in line]
assert maps and all(m.startswith(prefix) for m in maps), f"libfabric loaded from {set(maps)}"
print(f"pyddstore {pyddstore.__version__} from {site}, libfabric {got} from {maps[0]}")
EOF

step "pytest: gather path, stalled owners and providers over tcp and shm (libfabric $version)"
tests=(tests/test_gather.py tests/test_providers.py)
marks=(-m "not slow")
if [ "${LIBFABRIC2_FULL:-0}" = 1 ]; then
    tests+=(tests/test_store.py::test_method1_fabric_mpirun tests/test_store.py::test_method1_file_comm_plain_processes
        tests/test_store.py::test_method1_sockets)
    marks=()
fi
workers=()
[ "${TEST_WORKERS:-2}" = 0 ] || workers=(-n "${TEST_WORKERS:-2}")
rc=0
python -m pytest -q -p no:cacheprovider "${workers[@]}" "${marks[@]}" "${tests[@]}" "$@" || rc=$?
# Nothing selected (pytest's 5, e.g. after the test command's `-k`) is not a failure.
[ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || exit "$rc"
echo "libfabric $version: fabric, gather and provider tests passed in $((SECONDS - started)) s"
