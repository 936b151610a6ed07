#pragma once
// Programmatic dependent launch (Hopper): a kernel launched with
// launch_dependent() may start while the kernel before it on the stream is
// still running, so its blocks are resident and its loads of data that the
// earlier kernel does not write (weights, forward activations) are in flight
// by the time that kernel ends. Inside a captured CUDA graph the launch
// becomes a programmatic edge. Contract for a kernel launched this way:
//   - before wait_for_previous_kernel() it writes nothing to global memory
//     and reads only data whose writers had completed when the previous
//     kernel let it start (its layer's weight, written by the previous
//     step; forward activations from before the previous launch) and that
//     no kernel still running writes;
//   - wait_for_previous_kernel() returns once the previous kernel has
//     completed and its writes are visible; everything else comes after it.
// allow_next_kernel_to_start() lets the next dependent kernel be scheduled
// before this one ends (without it, that happens when this one's blocks
// exit). Called before this kernel's own wait, it lets the next one start
// while the kernel before this one may still run: its readers must allow
// for that (the classifier forward calls it after its wait, since the
// output-layer backward reads the forward activations before its own).
#include <cuda_runtime.h>

#include <utility>

#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel_to_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether the GPU supports it (Hopper or newer). Callers choose whether to
// use it (the `dependent` parameter of the launchers: BackendOptions::
// dependent_launch); a requested dependent launch on an older GPU is a
// plain one. Read once per process.
inline bool dependent_launch_supported() {
  static const bool supported = current_device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
  return supported;
}

struct LaunchGeometry {
  dim3 grid, block;
  std::size_t smem = 0;
  unsigned cluster = 1;  // blocks per cluster along x (1: no clusters)
};

// Launches `kernel` in `geometry`'s clusters; as a dependent of the stream's
// previous kernel (see the contract above) when `dependent` and the GPU
// supports it, else after it has completed.
template <typename... Params, typename... Args>
void launch_in_clusters(void (*kernel)(Params...), const LaunchGeometry& geometry, cudaStream_t stream, bool dependent,
                        Args&&... args) {
  cudaLaunchAttribute attrs[2]{};
  unsigned count = 0;
  if (dependent && dependent_launch_supported()) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (geometry.cluster > 1) {
    attrs[count].id = cudaLaunchAttributeClusterDimension;
    attrs[count++].val.clusterDim = {geometry.cluster, 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = geometry.grid;
  config.blockDim = geometry.block;
  config.dynamicSmemBytes = geometry.smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = count;
  SG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Launches `kernel` as a dependent of the stream's previous kernel (see the
// contract above) when `dependent` (the caller's choice: on for the step's
// kernels, off for the same-run baseline) and the GPU supports it; else a
// plain launch. The kernel must keep the contract either way.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), const LaunchGeometry& geometry, cudaStream_t stream, bool dependent,
                      Args&&... args) {
  launch_in_clusters(kernel, geometry, stream, dependent, std::forward<Args>(args)...);
}

}  // namespace sg::cuda
