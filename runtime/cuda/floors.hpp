#pragma once
// Hardware floors measured in the same run as a benchmark, so every timing
// is read against them: the cost of one stream launch and of one graph node
// (both of an empty kernel), and device-to-device copy bandwidth.
#include <cuda_runtime.h>

#include "ops/cuda/gpu_timing.hpp"  // enqueue_busy_wait, which the profiles time behind

namespace sg::cuda {

struct Floors {
  double empty_launch_us = 0;    // per empty kernel launched on a stream, back to back
  double graph_node_us = 0;      // per empty-kernel node of a replayed CUDA graph
  double copy_bandwidth_gbs = 0; // bytes read + written per second / 1e9
  double matmul_tflops = 0;      // cuBLASLt fp16 8192^3 matmul, fp32 accumulate
};

Floors measure_floors();

}  // namespace sg::cuda
