#!/usr/bin/env bash
# pyddstore against libfabric 2.x (Frontier ships 2.3.1; the system's here is 1.17), `make
# test-libfabric2`: builds libfabric from its source tarball into target/libfabric2/prefix
# (tcp, rxm, shm and sockets providers), regenerates the bindings against its headers and checks
# the committed ones (ddstore-fabric/libfabric-sys/src/bindings.rs) agree with them on every item
# pyddstore uses, builds pyddstore against it in target/libfabric2 (the main build is untouched),
# then runs the fabric transport tests (cargo) and the Python gather and provider tests over tcp
# and shm with it. Not part of the test command (it needs the tarball and ~10 minutes).
#   LIBFABRIC2_TARBALL  the source tarball (default $VENDOR_DIR/libfabric-2.3.1-src.tar.gz)
#   VENDOR_DIR          where the tarball lies (default ../shared/vendor, beside the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENDOR_DIR=${VENDOR_DIR:-../shared/vendor}
TARBALL=${LIBFABRIC2_TARBALL:-$VENDOR_DIR/libfabric-2.3.1-src.tar.gz}
WORK=$ROOT/target/libfabric2
PREFIX=$WORK/prefix
[ -f "$TARBALL" ] || { echo "no libfabric source tarball at $TARBALL: set LIBFABRIC2_TARBALL or VENDOR_DIR" >&2; exit 1; }
if ! command -v autoconf >/dev/null || ! command -v automake >/dev/null || ! command -v libtoolize >/dev/null; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "==> apt-get install autoconf automake libtool (libfabric's autogen.sh)"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq autoconf automake libtool >/dev/null
fi
. .venv/bin/activate

# 1. libfabric from source (skipped when this tarball's build is already installed).
mkdir -p "$WORK"
if [ ! -f "$PREFIX/lib/libfabric.so" ] || ! cmp -s "$TARBALL" "$WORK/built-from.tar.gz"; then
    echo "==> building libfabric from $TARBALL into $PREFIX (autogen, configure, make)"
    rm -rf "$WORK/src" "$PREFIX"
    mkdir -p "$WORK/src"
    cp "$TARBALL" "$WORK/source.tar.gz"
    tar xzf "$WORK/source.tar.gz" -C "$WORK/src" --strip-components=1
    (
        cd "$WORK/src"
        [ -x configure ] || ./autogen.sh >"$WORK/autogen.log" 2>&1
        ./configure --prefix="$PREFIX" --disable-static --enable-only \
            --enable-tcp --enable-rxm --enable-shm --enable-sockets >"$WORK/configure.log" 2>&1
        make -j"$(nproc)" >"$WORK/make.log" 2>&1
        make install >"$WORK/install.log" 2>&1
    ) || { echo "libfabric build failed: see $WORK/*.log" >&2; exit 1; }
    mv "$WORK/source.tar.gz" "$WORK/built-from.tar.gz"
fi
export LIBFABRIC_HOME=$PREFIX
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
export LD_LIBRARY_PATH=$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CARGO_TARGET_DIR=$WORK/cargo
version=$(pkg-config --modversion libfabric)
echo "==> libfabric $version, providers: $("$PREFIX/bin/fi_info" -l | grep -v version | tr -d ':' | tr '\n' ' ')"

# 2. The committed bindings against these headers: every item pyddstore uses must be the same.
echo "==> bindings: regenerated from libfabric $version headers, compared with src/bindings.rs"
cargo build -q -p libfabric-sys --features bindgen
generated=$(ls -t "$CARGO_TARGET_DIR"/debug/build/libfabric-sys-*/out/bindings.rs | head -n 1)
python scripts/compare_bindings.py ddstore-fabric/libfabric-sys/src/bindings.rs "$generated" \
    ddstore-fabric

# 3. The fabric transport tests (file communicator, tcp;ofi_rxm, shm, sockets) against it.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
echo "==> cargo test -p ddstore-fabric --test ofi_transport (libfabric $version)"
cargo test -q --release -p ddstore-fabric --test ofi_transport

# 4. The extension against it, imported from target/libfabric2/site ahead of the checkout's.
echo "==> pyddstore against libfabric $version"
rm -rf "$WORK/wheels" "$WORK/site"
maturin build --release -q -o "$WORK/wheels" 2>&1 | grep -v "^$" | tail -n 2
python -m zipfile -e "$WORK"/wheels/pyddstore-*.whl "$WORK/site"
export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
python - "$version" "$WORK/site" "$PREFIX" <<'EOF'
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
echo "==> pytest: gather path and providers over tcp and shm (libfabric $version)"
python -m pytest -q -p no:cacheprovider tests/test_gather.py tests/test_providers.py \
    tests/test_store.py::test_method1_fabric_mpirun tests/test_store.py::test_method1_file_comm_plain_processes \
    tests/test_store.py::test_method1_sockets "$@"
echo "libfabric $version: bindings, fabric and gather tests passed"
