#!/usr/bin/env bash
# Installs the Debian packages stepgraph builds against (needs root or sudo).
# The CUDA toolkit (nvcc, cuBLASLt) is expected to be installed already; without
# it the build still succeeds and only the CPU backend is built.
# With --check it installs nothing: it names what is missing and exits 1 if a
# required package is (the optional ONNX ones do not count).
set -euo pipefail
packages=(cmake ninja-build g++ libfmt-dev libspdlog-dev doctest-dev libyaml-cpp-dev libcli11-dev
          nlohmann-json3-dev zlib1g-dev libdeflate-dev)
# Optional: ONNX export (stepgraph export --format onnx) and its CI check with
# Debian's python3-onnx; without them the build has no ONNX export and says so.
optional=(libonnx-dev libprotobuf-dev protobuf-compiler python3-onnx python3-numpy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
missing_optional=()
for p in "${optional[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing_optional+=("$p")
done
if [ "${1:-}" = --check ]; then
  [ ${#missing[@]} -eq 0 ] && exit 0
  echo "install_deps: missing ${missing[*]}"
  exit 1
fi
if [ ${#missing[@]} -eq 0 ] && [ ${#missing_optional[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
[ ${#missing[@]} -gt 0 ] && echo "install_deps: installing ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi
if [ ${#missing_optional[@]} -gt 0 ]; then
  echo "install_deps: installing optional ${missing_optional[*]} (ONNX export)"
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing_optional[@]}" ||
    echo "install_deps: could not install ${missing_optional[*]}: building without ONNX export"
fi
