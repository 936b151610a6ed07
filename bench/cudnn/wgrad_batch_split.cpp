// Does cutting a convolution's filter gradient into batch slices, each on its
// own stream, shorten it? (issue 37; docs/performance.md section 42: no.)
// cuDNN's fastest deterministic channels-last filter gradient ([K,R,S,C];
// CudnnConv's autotune) of the shipped CNNs' layers over the whole batch,
// against k slices of the batch, each its own CudnnConv run on its own stream
// forked from and joined back into one stream (the partial dWs' sum not
// included), launched directly and captured into a graph. GPU time
// (ops/cuda/gpu_timing.hpp: 20 runs, median of 5).
// Build on the GPU machine after `scripts/build.sh --build-dir B --target stepgraph`:
//   g++ -std=c++20 -O2 -I. -isystem /usr/local/cuda/include -isystem CUDNN_INCLUDE_DIR
//       bench/cudnn/wgrad_batch_split.cpp B/ops/cuda/libsg_ops_cuda.a CUDNN_LIBRARY
//       -Wl,-rpath,$(dirname CUDNN_LIBRARY) -L/usr/local/cuda/lib64 -lcudart -lcuda -lfmt -o /tmp/wgrad_batch_split
//   (CUDNN_INCLUDE_DIR and CUDNN_LIBRARY as B/CMakeCache.txt names them)
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "ops/cuda/conv_cudnn.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/gpu_timing.hpp"

using namespace sg::cuda;

int main() {
  struct Layer {
    const char* net;
    std::int64_t n, hw, c, k, r, padding;
  };
  const std::vector<Layer> layers{{"mnist_resnet 28x28 32->32", 128, 28, 32, 32, 3, 1},
                                  {"mnist_resnet 14x14 64->64", 128, 14, 64, 64, 3, 1},
                                  {"mnist_resnet 7x7 64->128", 128, 7, 64, 128, 3, 1},
                                  {"wide_adam 28x28 64->64 3x3", 64, 28, 64, 64, 3, 1},
                                  {"wide_adam 14x14 64->128 3x3", 64, 14, 64, 128, 3, 1},
                                  {"mnist_cnn_fast 14x14 32->64 5x5", 128, 14, 32, 64, 5, 2}};
  const Stream stream;
  const cudnn::Handle handle;
  std::vector<std::unique_ptr<Stream>> sides;
  for (int i = 0; i < 8; ++i) sides.push_back(std::make_unique<Stream>());
  std::vector<cudaEvent_t> events(9);
  for (auto& e : events) SG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (const Layer& l : layers) {
    for (const int k : {1, 2, 4, 8}) {
      if (l.n % k) continue;
      const ConvGeometry g{l.n / k, l.c, l.hw, l.hw, l.k, l.r, l.r, 1, l.padding};
      const std::size_t xs = std::size_t(g.n * l.hw * l.hw * l.c), ys = std::size_t(g.n * g.p() * g.q() * l.k);
      const std::size_t ws = std::size_t(l.k * l.c * l.r * l.r);
      DeviceBuffer x(xs * k * 2), y(ys * k * 2), w(ws * k * 2);
      for (const DeviceBuffer* b : {&x, &y, &w}) SG_CUDA_CHECK(cudaMemset(b->data(), 0, b->bytes()));
      ConvRequest r;
      r.direction = ConvDirection::backward_filter;
      r.geometry = g;
      r.io_type = CUDNN_DATA_HALF;
      r.channels_last = true;
      r.filter_channels_last = true;
      std::vector<ConvTensors> t;
      for (int i = 0; i < k; ++i)
        t.push_back({static_cast<char*>(x.data()) + 2 * xs * i, static_cast<char*>(w.data()) + 2 * ws * i,
                     static_cast<char*>(y.data()) + 2 * ys * i, nullptr});
      const CudnnConv conv(handle, r, t[0], stream.get(), true);
      std::vector<std::unique_ptr<DeviceBuffer>> workspaces;
      for (int i = 0; i < k; ++i)
        workspaces.push_back(std::make_unique<DeviceBuffer>(std::max<std::size_t>(conv.workspace_bytes(), 16)));
      const auto one = [&](cudaStream_t s) { conv.run(t[0], workspaces[0]->data(), s); };
      const auto split = [&](cudaStream_t s) {
        SG_CUDA_CHECK(cudaEventRecord(events[0], s));
        for (int i = 0; i < k; ++i) {
          SG_CUDA_CHECK(cudaStreamWaitEvent(sides[i]->get(), events[0]));
          conv.run(t[i], workspaces[i]->data(), sides[i]->get());
          SG_CUDA_CHECK(cudaEventRecord(events[i + 1], sides[i]->get()));
          SG_CUDA_CHECK(cudaStreamWaitEvent(s, events[i + 1]));
        }
      };
      const float slice_us = gpu_time_us(stream.get(), 20, 5, one);
      const float split_us = gpu_time_us(stream.get(), 20, 5, split);
      // The same fork/join captured into a graph and replayed (what a step would see).
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      SG_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
      split(stream.get());
      SG_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
      SG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      const float graph_us =
          gpu_time_us(stream.get(), 20, 5, [&](cudaStream_t s) { SG_CUDA_CHECK(cudaGraphLaunch(exec, s)); });
      std::printf("%-32s k=%d  one slice of %3lld: %6.2f us  k slices on k streams: %6.2f us  as a graph: %6.2f us"
                  "  (%s)\n",
                  l.net, k, static_cast<long long>(g.n), slice_us, split_us, graph_us, conv.label().c_str());
      SG_CUDA_CHECK(cudaGraphExecDestroy(exec));
      SG_CUDA_CHECK(cudaGraphDestroy(graph));
    }
  }
  for (cudaEvent_t e : events) SG_CUDA_CHECK(cudaEventDestroy(e));
  return 0;
}
