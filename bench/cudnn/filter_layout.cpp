// cuDNN's channels-last convolutions with the filter [K,C,R,S] (the
// parameter's layout) against [K,R,S,C] (issues 36, 37; docs/benchmarks.md
// "Channels-last filters for cuDNN"): for the shipped CNNs' layers, each
// pass's fastest deterministic engine (CudnnConv's autotune) timed as GPU
// time (ops/cuda/gpu_timing.hpp: 20 runs, median of 5), and the kernels one
// run launches (captured into a graph and listed: with [K,C,R,S] the forward
// and data gradient start with cuDNN's own nchwToNhwcKernel, the filter
// gradient ends with nhwcToNchwKernel). graph/filter_layout_pass.hpp is what
// came of it.
// Build on the GPU machine after `scripts/build.sh --build-dir B --target stepgraph`:
//   g++ -std=c++20 -O2 -I. -isystem /usr/local/cuda/include -isystem CUDNN_INCLUDE_DIR bench/cudnn/filter_layout.cpp
//       B/ops/cuda/libsg_ops_cuda.a CUDNN_LIBRARY -Wl,-rpath,$(dirname CUDNN_LIBRARY) -L/usr/local/cuda/lib64
//       -lcudart -lcuda -lfmt -o /tmp/filter_layout
//   (CUDNN_INCLUDE_DIR and CUDNN_LIBRARY as B/CMakeCache.txt names them)
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ops/cuda/conv_cudnn.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/gpu_timing.hpp"

using namespace sg::cuda;

namespace {

// The kernels (and other graph nodes) one run launches, in capture order.
std::string kernels_of(const std::function<void(cudaStream_t)>& run, cudaStream_t s) {
  cudaGraph_t graph = nullptr;
  SG_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  run(s);
  SG_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  std::size_t n = 0;
  SG_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  SG_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::string out;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    SG_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) {
      out += type == cudaGraphNodeTypeMemset ? " [memset]" : " [other node]";
      continue;
    }
    CUDA_KERNEL_NODE_PARAMS p{};
    const char* name = "?";
    if (cuGraphKernelNodeGetParams(reinterpret_cast<CUgraphNode>(node), &p) == CUDA_SUCCESS && p.func != nullptr &&
        cuFuncGetName(&name, p.func) != CUDA_SUCCESS)
      name = "?";
    out += " [" + std::string(name).substr(0, 70) + "]";
  }
  SG_CUDA_CHECK(cudaGraphDestroy(graph));
  return out;
}

const char* direction_name(ConvDirection d) {
  if (d == ConvDirection::forward) return "forward";
  return d == ConvDirection::backward_data ? "backward data" : "backward filter";
}

}  // namespace

int main() {
  struct Layer {
    const char* net;
    std::int64_t n, hw, c, k, r, padding;
    bool bias;  // the forward's bias + ReLU in cuDNN's graph
  };
  const std::vector<Layer> layers{{"mnist_cnn_fast 14x14 32->64 5x5", 128, 14, 32, 64, 5, 2, true},
                                  {"wide_adam 28x28 64->64 3x3", 64, 28, 64, 64, 3, 1, true},
                                  {"wide_adam 14x14 64->128 3x3", 64, 14, 64, 128, 3, 1, true},
                                  {"mnist_resnet 28x28 32->32", 128, 28, 32, 32, 3, 1, false},
                                  {"mnist_resnet 14x14 32->64", 128, 14, 32, 64, 3, 1, false},
                                  {"mnist_resnet 14x14 64->64", 128, 14, 64, 64, 3, 1, false},
                                  {"mnist_resnet 7x7 64->128", 128, 7, 64, 128, 3, 1, false}};
  const Stream stream;
  const cudnn::Handle handle;
  for (const Layer& l : layers) {
    const ConvGeometry g{l.n, l.c, l.hw, l.hw, l.k, l.r, l.r, 1, l.padding};
    DeviceBuffer x(static_cast<std::size_t>(l.n * l.hw * l.hw * l.c * 2));
    DeviceBuffer w(static_cast<std::size_t>(l.k * l.c * l.r * l.r * 2));
    DeviceBuffer y(static_cast<std::size_t>(l.n * g.p() * g.q() * l.k * 2)), b(static_cast<std::size_t>(l.k * 2));
    for (const DeviceBuffer* buffer : {&x, &w, &y, &b}) SG_CUDA_CHECK(cudaMemset(buffer->data(), 0, buffer->bytes()));
    for (ConvDirection d : {ConvDirection::forward, ConvDirection::backward_data, ConvDirection::backward_filter})
      for (const bool krsc : {false, true}) {
        ConvRequest r;
        r.direction = d;
        r.geometry = g;
        r.io_type = CUDNN_DATA_HALF;
        r.bias = r.relu = d == ConvDirection::forward && l.bias;
        r.channels_last = true;
        r.filter_channels_last = krsc;
        const ConvTensors t{x.data(), w.data(), y.data(), b.data()};
        const CudnnConv conv(handle, r, t, stream.get(), true);
        const DeviceBuffer workspace(std::max<std::size_t>(conv.workspace_bytes(), 16));
        const auto run = [&](cudaStream_t s) { conv.run(t, workspace.data(), s); };
        const float us = gpu_time_us(stream.get(), 20, 5, run);
        std::printf("%-32s %-15s %s %6.2f us  %s |%s\n", l.net, direction_name(d), krsc ? "[K,R,S,C]" : "[K,C,R,S]", us,
                    conv.label().c_str(), kernels_of(run, stream.get()).c_str());
      }
  }
  return 0;
}
