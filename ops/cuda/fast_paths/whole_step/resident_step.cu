// Training steps with the weights resident in one cluster's shared memory
// (see resident_step.hpp). Per step, with L layers (l = 0 .. L-2 hidden,
// L-1 the classifier) and a cluster barrier after each line but the last:
//   F_l (l < L-2)  fetch (l = 0); own columns of act[l]; all-gather them
//   F_{L-2}        own columns of the last hidden output; partial logits to
//                  every block
//   loss + B_{L-2} logits, softmax-xent, classifier and last-bias SGD, own
//                  gradient columns; partial dX to its owners; W_{L-2} SGD
//   B_l (l >= 1)   own gradient columns from the partials; partial dX to
//                  its owners; W_l SGD
//   B_0            own gradient columns; W_0 SGD (no barrier: nothing remote
//                  is read or written until the next step's first barrier)
// Buffers written by other blocks are reused only after a barrier that
// every reader of the old contents has passed; the two exchange buffers
// alternate between consecutive dgrad layers for that reason.
#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/fast_paths/whole_step/resident_step.hpp"
#include "ops/cuda/fast_paths/whole_step/resident_step_phases.cuh"
#include "ops/cuda/fast_paths/whole_step/step_common.cuh"
#include "ops/cuda/fast_paths/whole_step/whole_step.hpp"
#include "ops/cuda/kernel_limits.hpp"
#include "ops/cuda/phase_marks.cuh"

namespace sg::cuda {
namespace {

// ---- the kernel --------------------------------------------------------------

// A: the hidden layers' activation.
template <int B, Activation A>
__global__ void __launch_bounds__(kBlockThreads, 1)
    resident_steps_kernel(const __grid_constant__ WholeStepArgs a, const __grid_constant__ ResidentLayout lay, int steps) {
  // Everything indexed by a runtime layer number lives in shared memory or
  // the (__grid_constant__) parameters, never on the stack: with ~220 KB of
  // shared memory the L1 left for per-thread local memory is tiny, and a
  // stack would make every such access an L2 round trip.
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ Carve carved;
  __shared__ UpdateScalars wsgd[kResidentMaxLayers], bsgd[kResidentMaxLayers];
  cg::cluster_group cluster = cg::this_cluster();
  const int L = a.layers, hidden = L - 1, C = a.dims[L], S = lay.cluster;
  const int me = int(cluster.block_rank());
  if (threadIdx.x == 0) carved = carve(lay, smem, hidden);
  for (int l = threadIdx.x; l < L; l += blockDim.x) {
    wsgd[l] = *a.weight_sgd[l];
    bsgd[l] = *a.bias_sgd[l];
  }
  __syncthreads();
  // A block may touch another's shared memory only once that block runs:
  // arrive now, wait before the first exchange (the loads below overlap it).
  cluster_arrive();
  const Carve& c = carved;
  // Own columns of hidden layer l's pre-activation (gelu, gelu_tanh, silu only).
  const auto pre = [&](int l) { return reinterpret_cast<__half*>(smem + lay.pre[l]); };
  const std::int64_t first_step = *a.step;
  const int J_last = lay.own[hidden - 1], ld_own = lay.own_stride;

  // Load the owned parameters.
  for (int l = 0; l < hidden; ++l) {
    const int J = lay.own[l], K = a.dims[l];
    copy_rows_in(c.w[l], lay.w_stride[l], a.weight[l] + std::int64_t(me) * J * K, K, J, K);
    for (int j = threadIdx.x; j < J; j += blockDim.x) c.b[l][j] = a.bias[l][me * J + j];
  }
  for (int e = threadIdx.x; e < C * J_last; e += blockDim.x)
    c.w_last[e] = a.weight[L - 1][std::int64_t(e / J_last) * a.dims[L - 1] + me * J_last + e % J_last];
  for (int cls = threadIdx.x; cls < C; cls += blockDim.x) c.b_last[cls] = a.bias[L - 1][cls];

  prefetch_batch<B>(a, c, first_step);
  cluster_wait();
  for (int s = 0; s < steps; ++s) {
    const bool first = s == 0;
    int phase = 0;
    mark_phase(a.phase_clock, phase++, first);
    take_batch<B>(a, lay, c);  // (its first barrier: the last step's W_0 update read x)

    // Forward through the hidden layers.
    for (int l = 0; l < hidden; ++l) {
      const int J = lay.own[l];
      const __half* in = l == 0 ? c.x : c.act[l - 1];
      const int ld_in = l == 0 ? lay.x_stride : lay.act_stride[l - 1];
      rows_times_owned_rows<B>(in, ld_in, c.w[l], lay.w_stride[l], a.dims[l], J, c.exchange[0]);
      if (l + 1 < hidden) {
        finish_forward<B, A>(c.exchange[0], c.b[l], c.act[l], lay.act_stride[l], me * J, J, pre(l), ld_own);
        all_gather_columns<B>(cluster, c.act[l], lay.act_stride[l], me * J, J, me, S);
      } else {
        finish_forward<B, A>(c.exchange[0], c.b[l], c.h_last, ld_own, 0, J, pre(l), ld_own);
        push_partial_logits<B>(cluster, c, ld_own, J, C, c.exchange[1], me, S);
      }
      cluster_arrive();
      if (l == 0 && s + 1 < steps) prefetch_batch<B>(a, c, first_step + s + 1);  // the staging buffer is free
      cluster_wait();
      mark_phase(a.phase_clock, phase++, first);
    }

    // Loss, then backward through the hidden layers; the gradient columns
    // of layer l are in c.grad. Between a barrier's arrive and its wait go
    // the updates that only touch this block's memory.
    softmax_xent<B>(c, c.exchange[1], S, C, a.loss, me == 0);
    classifier_dgrad<B, A>(c, ld_own, J_last, C, kBackwardReadsInput<A> ? pre(hidden - 1) : nullptr);
    __syncthreads();
    for (int l = hidden - 1; l >= 0; --l) {
      const int J = lay.own[l], K = a.dims[l];
      const __half* in = l == 0 ? c.x : c.act[l - 1];
      const int ld_in = l == 0 ? lay.x_stride : lay.act_stride[l - 1];
      float* exchange = c.exchange[(hidden - 1 - l) % 2];
      if (l >= 1) push_input_gradient<B>(cluster, c.grad, ld_own, c.w[l], lay.w_stride[l], J, K, lay.own[l - 1], exchange, me);
      // act[0] is rewritten by the next step's first all-gather, which only
      // this barrier separates from here: W_1's update reads it before arriving.
      const bool update_before_arrive = l == 1;
      if (l >= 1 && !update_before_arrive) cluster_arrive();
      if (l == hidden - 1) classifier_sgd<B>(c, ld_own, J_last, C, wsgd[L - 1], bsgd[L - 1]);
      update_owned_bias<B>(c.grad, ld_own, c.b[l], J, bsgd[l]);
      __syncthreads();  // W_l was read above
      update_owned_rows<B>(c.grad, ld_own, in, ld_in, c.w[l], lay.w_stride[l], J, K, wsgd[l]);
      if (l == 0) break;
      if (update_before_arrive) cluster_arrive();
      cluster_wait();
      __syncthreads();  // the wait orders arrivals, not the work after them: W_l's update read c.grad
      mark_phase(a.phase_clock, phase++, first);
      const int J_prev = lay.own[l - 1];
      if constexpr (kBackwardReadsInput<A>)
        reduce_input_gradient<B, A>(exchange, S, pre(l - 1), ld_own, 0, c.grad, ld_own, J_prev);
      else
        reduce_input_gradient<B, A>(exchange, S, c.act[l - 1], lay.act_stride[l - 1], me * J_prev, c.grad, ld_own,
                                    J_prev);
      __syncthreads();
    }
    // With one hidden layer nothing else separates this step's reads of the
    // partial logits from the next step's writes.
    if (hidden == 1) cluster.sync();
    mark_phase(a.phase_clock, phase++, first);
  }

  // Write the parameters back; the step counter advances by `steps`.
  __syncthreads();
  for (int l = 0; l < hidden; ++l) {
    const int J = lay.own[l], K = a.dims[l];
    copy_rows_out(a.weight[l] + std::int64_t(me) * J * K, K, c.w[l], lay.w_stride[l], J, K);
    for (int j = threadIdx.x; j < J; j += blockDim.x) a.bias[l][me * J + j] = c.b[l][j];
  }
  for (int e = threadIdx.x; e < C * J_last; e += blockDim.x)
    a.weight[L - 1][std::int64_t(e / J_last) * a.dims[L - 1] + me * J_last + e % J_last] = c.w_last[e];
  if (me == 0)
    for (int cls = threadIdx.x; cls < C; cls += blockDim.x) a.bias[L - 1][cls] = c.b_last[cls];
  cluster.sync();  // every block read the step counter long ago; no DSMEM access may outlive a block
  if (me == 0 && threadIdx.x == 0) *a.step = std::int32_t(first_step + steps);
}

using KernelFn = void (*)(WholeStepArgs, ResidentLayout, int);

KernelFn kernel_for(int batch, Activation activation) {
  return with_activation(activation, [&](auto act) -> KernelFn {
    constexpr Activation A = decltype(act)::value;
    switch (batch) {
      case 16: return resident_steps_kernel<16, A>;
      case 32: return resident_steps_kernel<32, A>;
      case 48: return resident_steps_kernel<48, A>;
      case 64: return resident_steps_kernel<64, A>;
    }
    throw CudaError(fmt::format("resident_steps_kernel: no instance for batch {}", batch));
  });
}

// The layout for a cluster of S blocks (bytes = 0 when the columns do not
// split into whole 16-wide tiles).
ResidentLayout layout_for(const WholeStepArgs& a, int S) {
  ResidentLayout lay;
  lay.cluster = S;
  const int hidden = a.layers - 1, B = a.batch, C = a.dims[a.layers];
  int j_max = 0;
  for (int l = 0; l < hidden; ++l) {
    if (a.dims[l + 1] % (16 * S) != 0) return {};
    lay.own[l] = a.dims[l + 1] / S;
    lay.w_stride[l] = a.dims[l] + 8;
    lay.act_stride[l] = a.dims[l + 1] + 8;
    j_max = std::max(j_max, lay.own[l]);
  }
  lay.x_stride = a.dims[0] + 8;
  lay.own_stride = j_max + 8;
  std::size_t off = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t at = off;
    off = (off + bytes + 127) / 128 * 128;
    return at;
  };
  lay.x = take(std::size_t(B) * lay.x_stride * 2);
  for (int l = 0; l < hidden; ++l) {
    lay.w[l] = take(std::size_t(lay.own[l]) * lay.w_stride[l] * 2);
    lay.b[l] = take(std::size_t(lay.own[l]) * 2);
    if (l + 1 < hidden) lay.act[l] = take(std::size_t(B) * lay.act_stride[l] * 2);
  }
  const int j_last = lay.own[hidden - 1];
  lay.w_last = take(std::size_t(C) * j_last * 2);
  lay.b_last = take(std::size_t(C) * 2);
  lay.h_last = take(std::size_t(B) * lay.own_stride * 2);
  lay.grad = take(std::size_t(B) * lay.own_stride * 2);
  // exchange[0]: partial dX, and the forward's split-K partials; exchange[1]:
  // partial dX, and the partial logits (see the kernel for why these share).
  const std::size_t dx = std::size_t(S) * B * j_max * 4;
  lay.exchange[0] = take(std::max(dx, std::size_t(kWarps) * B * j_max * 4));
  lay.exchange[1] = take(std::max(dx, std::size_t(S) * B * C * 4));
  lay.logits = take(std::size_t(B) * C * 2);
  lay.dlogits = take(std::size_t(B) * C * 2);
  lay.logits_partial = take(std::size_t(B) * C * 4);
  lay.row_loss = take(std::size_t(B) * 4);
  lay.labels = take(std::size_t(B) * 4);
  lay.staging = take(std::size_t(B) * a.dims[0]);
  lay.labels_next = take(std::size_t(B) * 4);
  if (backward_reads_input(a.activation))  // (after the rest: the ReLU layout is the one it always was)
    for (int l = 0; l < hidden; ++l) lay.pre[l] = take(std::size_t(B) * lay.own_stride * 2);
  lay.bytes = off;
  return lay;
}

// Dynamic shared memory a block may have next to the kernel's static share.
std::size_t dynamic_shared_limit(int batch, Activation activation) {
  cudaFuncAttributes attr{};
  SG_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel_for(batch, activation)));
  return std::size_t(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)) - attr.sharedSizeBytes;
}

// Whether one cluster of this layout fits on the GPU (sets the attributes it needs).
bool cluster_fits(const WholeStepArgs& a, const ResidentLayout& lay) {
  const KernelFn kernel = kernel_for(a.batch, a.activation);
  // The most any layout may ask for: trainers of different widths share the kernel.
  SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(dynamic_shared_limit(a.batch, a.activation))));
  SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = one_cluster_config(lay.cluster, kBlockThreads, lay.bytes, nullptr, attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0) return true;
  (void)cudaGetLastError();  // a refused size is an answer, not an error
  return false;
}

// Sizes the kernel's code does not handle, whatever the cluster.
std::string shape_unsupported(const WholeStepArgs& a) {
  if (a.layers < 2 || a.layers > kResidentMaxLayers) return fmt::format("{} layers (2..{} supported)", a.layers, kResidentMaxLayers);
  if (a.batch != 16 && a.batch != 32 && a.batch != 48 && a.batch != 64) return fmt::format("batch {}", a.batch);
  if (a.dims[0] % 16 != 0) return fmt::format("input width {} is not a multiple of 16", a.dims[0]);
  if (a.dims[a.layers] > kWholeStepMaxClasses) return fmt::format("{} classes", a.dims[a.layers]);
  if (a.rows < a.batch) return "fewer dataset rows than one batch";
  if (current_device_attribute(cudaDevAttrComputeCapabilityMajor) < 9) return "thread-block clusters need compute capability 9.0";
  return {};
}

// Cluster sizes to try, largest first (0), or the one asked for.
std::vector<int> cluster_candidates(int cluster) {
  if (cluster == 0) return {kResidentClusterSizes.begin(), kResidentClusterSizes.end()};
  if (std::find(kResidentClusterSizes.begin(), kResidentClusterSizes.end(), cluster) == kResidentClusterSizes.end())
    throw CudaError(fmt::format("resident steps: cluster size {} (0 or one of {})", cluster,
                                fmt::join(kResidentClusterSizes, ", ")));
  return {cluster};
}

}  // namespace

std::string resident_step_unsupported(const WholeStepArgs& a, int cluster) {
  if (a.gradients_out)  // its steps follow each other inside one launch: no update stage between them
    return "an update rule: it runs several steps per launch, each applying SGD to the weights it keeps";
  if (auto why = shape_unsupported(a); !why.empty()) return why;
  for (int S : cluster_candidates(cluster)) {
    const ResidentLayout lay = layout_for(a, S);
    if (lay.bytes && lay.bytes <= dynamic_shared_limit(a.batch, a.activation) && cluster_fits(a, lay)) return {};
  }
  return cluster ? fmt::format("a cluster of {} does not hold the weights in shared memory", cluster)
                 : "no cluster holds the weights in shared memory";
}

ResidentLayout plan_resident_layout(const WholeStepArgs& a, int cluster) {
  if (auto why = shape_unsupported(a); !why.empty()) throw CudaError("resident steps: " + why);
  for (int S : cluster_candidates(cluster)) {
    const ResidentLayout lay = layout_for(a, S);
    if (lay.bytes && lay.bytes <= dynamic_shared_limit(a.batch, a.activation) && cluster_fits(a, lay)) return lay;
  }
  throw CudaError("resident steps: no cluster holds the weights in shared memory");
}

void launch_resident_steps(const WholeStepArgs& args, const ResidentLayout& layout, int steps, cudaStream_t stream) {
  if (steps < 1) throw CudaError("resident_steps_kernel: launched for no steps");
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = one_cluster_config(layout.cluster, kBlockThreads, layout.bytes, stream, attr);
  SG_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel_for(args.batch, args.activation), args, layout, steps));
}

std::vector<std::string> resident_step_phase_names(int layers) {
  std::vector<std::string> names;
  const int hidden = layers - 1;
  for (int l = 0; l < hidden; ++l) {
    std::string name = l == 0 ? "fetch + layer 1 forward" : fmt::format("layer {} forward", l + 1);
    names.push_back(l + 1 < hidden ? name + " + all-gather" : name + " + partial logits");
  }
  for (int l = hidden - 1; l >= 0; --l) {
    std::string name = l == hidden - 1 ? fmt::format("softmax-xent + layer {} SGD + ", layers) : std::string();
    name += l >= 1 ? fmt::format("layer {} dgrad + SGD", l + 1) : "layer 1 SGD";
    names.push_back(name);
  }
  return names;
}

}  // namespace sg::cuda
