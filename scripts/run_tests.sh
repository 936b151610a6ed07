#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite with ctest. GPU tests print
# a SKIPPED line and are reported as skipped on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
