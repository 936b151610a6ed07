#!/usr/bin/env bash
# Configures and builds stepgraph (Release, CUDA for sm_90 unless
# STEPGRAPH_CUDA_ARCHS says otherwise; STEPGRAPH_WERROR=ON, as CI sets it,
# makes warnings errors).
#
# Usage: scripts/build.sh [--build-dir DIR] [--cpu-only] [--target T]...
#   --build-dir DIR  configure and build in DIR (default build/)
#   --cpu-only       configure without CUDA (-DSTEPGRAPH_WITH_CUDA=OFF)
#   --target T       build only target T (repeatable; default: everything)
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/build.sh [--build-dir DIR] [--cpu-only] [--target T]..."
build_dir=build
with_cuda=ON
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir | --target)
      if [ $# -lt 2 ] || [ -z "$2" ]; then
        echo "build: $1 needs a value ($usage)" >&2
        exit 2
      fi
      if [ "$1" = --build-dir ]; then build_dir=$2; else targets+=("$2"); fi
      shift 2 ;;
    --cpu-only) with_cuda=OFF; shift ;;
    *) echo "build: unknown argument '$1' ($usage)" >&2; exit 2 ;;
  esac
done
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_CUDA_ARCHS="${STEPGRAPH_CUDA_ARCHS:-90}" \
  -DSTEPGRAPH_WERROR="${STEPGRAPH_WERROR:-OFF}" -DSTEPGRAPH_WITH_CUDA="$with_cuda"
target_args=()
if [ ${#targets[@]} -gt 0 ]; then target_args=(--target "${targets[@]}"); fi
cmake --build "$build_dir" -j "$(nproc)" "${target_args[@]}"
