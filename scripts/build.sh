#!/usr/bin/env bash
# Configures and builds stepgraph into build/ (Release, CUDA for sm_90 unless
# STEPGRAPH_CUDA_ARCHS says otherwise; STEPGRAPH_WERROR=ON, as CI sets it,
# makes warnings errors).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_CUDA_ARCHS="${STEPGRAPH_CUDA_ARCHS:-90}" \
  -DSTEPGRAPH_WERROR="${STEPGRAPH_WERROR:-OFF}"
cmake --build build -j "$(nproc)"
