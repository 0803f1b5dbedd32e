#!/usr/bin/env bash
# Lint: rustfmt, clippy (default features and without MPI) with warnings as
# errors (missing_docs included), ruff, and the stub check of _native.pyi
# against the built extension. Run by scripts/run-tests.sh and `make lint`.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> ruff"
python -m ruff check .
python -m ruff format --check .
echo "==> stub check (_native.pyi against the built module)"
python scripts/check_stub.py
echo "==> shellcheck (jobs/, scripts/: warnings and errors)"
shellcheck -S warning jobs/*.sh scripts/*.sh
echo "==> clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo clippy -p pyddstore -p ddstore-fabric --no-default-features --all-targets --quiet -- -D warnings
