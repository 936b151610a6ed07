#!/usr/bin/env bash
# Installs the Debian packages stepgraph builds against (needs root or sudo).
# The CUDA toolkit (nvcc, cuBLASLt) is expected to be installed already; without
# it the build still succeeds and only the CPU backend is built.
set -euo pipefail
packages=(cmake ninja-build g++ libfmt-dev libspdlog-dev doctest-dev libyaml-cpp-dev libcli11-dev
          nlohmann-json3-dev zlib1g-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
