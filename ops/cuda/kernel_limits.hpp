#pragma once
// Limits of kernel knobs that callers choose (BackendOptions, configs, bench
// flags) and validate before any CUDA call. Plain C++: no CUDA headers, so
// code built without CUDA can check against them.
#include <array>

namespace sg::cuda {

// One-pass column-strip kernel: blocks sharing a strip (a power of two; a
// portable cluster size).
constexpr int kMaxStripSplits = 8;

// Resident-weights whole-step kernel: the cluster sizes it is built for,
// largest first (the order they are tried in when none is asked for).
constexpr std::array<int, 5> kResidentClusterSizes = {16, 8, 4, 2, 1};

}  // namespace sg::cuda
