#!/usr/bin/env bash
# Builds the fuzz targets without running them (see fuzz/README.md), so that CI notices when a
# change breaks them. Installs cargo-fuzz when it is missing. cargo-fuzz passes nightly-only
# flags to rustc; RUSTC_BOOTSTRAP=1 lets a stable toolchain take them.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
# Their own target directory (fuzz/target): their flags would rebuild the workspace's.
unset CARGO_TARGET_DIR
# --dev: a debug build is enough to know they compile and link, in half the time of -O.
RUSTC_BOOTSTRAP=1 cargo fuzz build --dev
echo "fuzz targets built: $(cargo fuzz list | tr '\n' ' ')"
