// NCCL's all-reduce on 2 GPUs of one host, one thread per GPU (issue 38,
// docs/data_parallel.md "NCCL's symmetric kernels"): the times behind
// data_parallel.symmetric_memory / nccl_ctas, and the exactness check that
// found grouped symmetric all-reduces returning wrong results (NCCL 2.28.3).
//   times: in a captured graph of 20 in-place f16 all-reduces (median of 9
//     replays): ncclAvg on cudaMalloc memory against ncclSum on an
//     ncclMemAlloc'd, registered window (NCCL's symmetric kernels), for NCCL's
//     CTA choice and fixed CTA counts;
//   check: the 784-1024x3-10 MLP's 8 gradient tensors (f32, random) reduced
//     with ncclSum in a window, grouped or one call each, out of place or in
//     place, against a + b bit for bit; prints the wrong elements per tensor.
// Build on the GPU machine (NCCL >= 2.27):
//   g++ -std=c++20 -O2 -pthread bench/nccl/symmetric_all_reduce.cpp -o /tmp/nccl_sym
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -lnccl
//   (host code only; where libnccl.so is not on the link path, name the library file itself,
//   e.g. /usr/lib/x86_64-linux-gnu/libnccl.so.2 on the GPU image)
//   NCCL_NVLS_ENABLE=0 /tmp/nccl_sym   (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING names the kernels)
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__);          \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define CHECK_NCCL(x)                                                                  \
  do {                                                                                 \
    ncclResult_t r_ = (x);                                                             \
    if (r_ != ncclSuccess) {                                                           \
      std::printf("NCCL %s at line %d\n", ncclGetErrorString(r_), __LINE__);          \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace {

constexpr int kRanks = 2;
const std::vector<std::size_t> kMlpTensors = {1024 * 784, 1024, 1024 * 1024, 1024, 1024 * 1024, 1024, 10 * 1024, 10};

// A buffer on this rank's device: cudaMalloc'd, or ncclMemAlloc'd and registered as a symmetric window.
struct Buffer {
  Buffer(ncclComm_t comm, std::size_t bytes, bool window) : comm(comm) {
    if (window) {
      CHECK_NCCL(ncclMemAlloc(&ptr, bytes));
      CHECK_NCCL(ncclCommWindowRegister(comm, ptr, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
    } else {
      CHECK_CUDA(cudaMalloc(&ptr, bytes));
    }
  }
  ~Buffer() {
    if (win) {
      CHECK_NCCL(ncclCommWindowDeregister(comm, win));
      CHECK_NCCL(ncclMemFree(ptr));
    } else {
      CHECK_CUDA(cudaFree(ptr));
    }
  }
  ncclComm_t comm;
  void* ptr = nullptr;
  ncclWindow_t win = nullptr;
};

// Median microseconds of one in-place f16 all-reduce of `count` elements, 20 to a captured graph.
float time_all_reduce(ncclComm_t comm, cudaStream_t s, std::barrier<>& sync, std::size_t count, bool window) {
  Buffer buf(comm, count * 2, window);
  CHECK_CUDA(cudaMemset(buf.ptr, 0, count * 2));
  const ncclRedOp_t op = window ? ncclSum : ncclAvg;  // the symmetric kernels take ncclSum only
  constexpr int kPerGraph = 20;
  CHECK_NCCL(ncclAllReduce(buf.ptr, buf.ptr, count, ncclFloat16, op, comm, s));  // connection setup, outside capture
  CHECK_CUDA(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kPerGraph; ++i) CHECK_NCCL(ncclAllReduce(buf.ptr, buf.ptr, count, ncclFloat16, op, comm, s));
  CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(exec, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> us;
  for (int i = 0; i < 9; ++i) {
    sync.arrive_and_wait();
    CHECK_CUDA(cudaEventRecord(start, s));
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaEventRecord(stop, s));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(ms * 1000 / kPerGraph);
  }
  std::sort(us.begin(), us.end());
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  sync.arrive_and_wait();
  return us[4];
}

// Rank 0's result of the MLP bucket reduced in a window: grouped or not, in place or not.
std::vector<float> reduce_mlp_bucket(ncclComm_t comm, cudaStream_t s, std::barrier<>& sync,
                                     const std::vector<float>& input, bool grouped, bool in_place) {
  const std::size_t total = input.size();
  Buffer buf(comm, total * 8, true);
  float* in = static_cast<float*>(buf.ptr);
  float* out = in_place ? in : in + total;
  CHECK_CUDA(cudaMemcpy(in, input.data(), total * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(in + total, 0, total * 4));
  CHECK_CUDA(cudaDeviceSynchronize());
  sync.arrive_and_wait();
  if (grouped) CHECK_NCCL(ncclGroupStart());
  std::size_t offset = 0;
  for (std::size_t count : kMlpTensors) {
    CHECK_NCCL(ncclAllReduce(in + offset, out + offset, count, ncclFloat32, ncclSum, comm, s));
    offset += count;
  }
  if (grouped) CHECK_NCCL(ncclGroupEnd());
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<float> result(total);
  CHECK_CUDA(cudaMemcpy(result.data(), out, total * 4, cudaMemcpyDeviceToHost));
  sync.arrive_and_wait();
  return result;
}

}  // namespace

int main() {
  const std::vector<int> cta_counts = {0, 16, 32, 64};  // 0: NCCL's choice
  const std::vector<std::size_t> sizes = {10250, 803840, 1049600, 2915000, 67117056};  // f16 elements
  std::vector<ncclUniqueId> ids(cta_counts.size());
  for (auto& id : ids) CHECK_NCCL(ncclGetUniqueId(&id));
  std::size_t total = 0;
  for (std::size_t c : kMlpTensors) total += c;
  std::vector<std::vector<float>> inputs(kRanks, std::vector<float>(total));
  for (int r = 0; r < kRanks; ++r) {
    std::mt19937 rng(r + 1);
    std::normal_distribution<float> value(0.f, 1.f);
    for (float& v : inputs[r]) v = value(rng);
  }
  const char* check_names[4] = {"out of place, grouped", "out of place, one call each", "in place, grouped",
                                "in place, one call each"};
  std::vector<std::vector<float>> checked(4);
  std::barrier sync(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      CHECK_CUDA(cudaSetDevice(r));
      cudaStream_t s;
      CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      for (std::size_t c = 0; c < cta_counts.size(); ++c) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        if (cta_counts[c] > 0) config.minCTAs = config.maxCTAs = cta_counts[c];
        ncclComm_t comm;
        CHECK_NCCL(ncclCommInitRankConfig(&comm, kRanks, ids[c], r, &config));
        for (std::size_t count : sizes) {
          const float ring = time_all_reduce(comm, s, sync, count, false);
          const float symmetric = time_all_reduce(comm, s, sync, count, true);
          if (r == 0)
            std::printf("CTAs %2d  %9.2f MB f16: ncclAvg %8.1f us   ncclSum in a window %8.1f us\n", cta_counts[c],
                        count * 2 / 1e6, ring, symmetric);
        }
        if (cta_counts[c] == 32)
          for (int v = 0; v < 4; ++v) {
            auto result = reduce_mlp_bucket(comm, s, sync, inputs[r], v % 2 == 0, v >= 2);
            if (r == 0) checked[v] = std::move(result);
          }
        CHECK_NCCL(ncclCommDestroy(comm));
      }
      CHECK_CUDA(cudaStreamDestroy(s));
    });
  for (auto& t : ranks) t.join();
  int failures = 0;
  for (int v = 0; v < 4; ++v) {
    std::vector<std::size_t> wrong(kMlpTensors.size(), 0);
    std::size_t offset = 0;
    for (std::size_t t = 0; t < kMlpTensors.size(); ++t) {
      for (std::size_t i = offset; i < offset + kMlpTensors[t]; ++i) {
        const float want = inputs[0][i] + inputs[1][i];
        wrong[t] += std::memcmp(&checked[v][i], &want, sizeof want) != 0;
      }
      offset += kMlpTensors[t];
    }
    std::size_t sum = 0;
    std::string per_tensor;
    for (std::size_t w : wrong) {
      sum += w;
      per_tensor += " " + std::to_string(w);
    }
    std::printf("symmetric ncclSum of the MLP bucket, %-28s %zu of %zu elements wrong (per tensor:%s)\n",
                check_names[v], sum, total, per_tensor.c_str());
    failures += sum != 0;
  }
  return failures == 0 ? 0 : 2;
}
