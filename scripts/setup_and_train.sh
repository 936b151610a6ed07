#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, fetch MNIST
# (verified by SHA-256) and train the default config. On a machine without a
# CUDA GPU the app falls back to the CPU backend; the default config is sized
# for a GPU, so then the smaller CPU config is trained instead (said below).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/fetch_mnist.sh data/mnist
config="${1:-configs/mnist_mlp.yaml}"
if [ $# -eq 0 ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "setup_and_train: no NVIDIA GPU visible; training configs/mnist_cpu.yaml on the CPU backend instead of $config"
  config=configs/mnist_cpu.yaml
fi
shift $(( $# > 0 ? 1 : 0 ))
exec build/apps/stepgraph train --config "$config" "$@"
