// One cooperative kernel per training step (see whole_step.hpp). Phases, with
// a grid-wide barrier after each (L layers, 0-based l):
//   fetch      every block gathers the batch into its own shared memory
//   F_l        hidden layer l: act[l] = act(x W_l^T + b_l)           (tensor cores)
//              (and pre[l] = x W_l^T + b_l where the backward reads it)
//   softmax    every block: the logits and dlogits in its shared memory
//              (block 0 also stores the loss); grad[L-2] = act'((dlogits
//              W_{L-1}), saved L-2)
//   Q_l        l = L-2 .. 0: grad[l-1] = act'((grad[l] W_l), saved l-1),
//              saved l being act[l] or (gelu, gelu_tanh, silu) pre[l];
//              W_{l+1} -= lr grad[l+1]^T act[l]; b_l -= lr colsum(grad[l])
//              (and b_{L-1} from dlogits);
//              at l = 0 also W_0 -= lr grad[0]^T x and the step advances
// With WholeStepArgs::gradients_out each update instead stores its gradient
// for the update stage's launch after the kernel (any update rule), which
// also advances the step.
// A weight is only updated in the phase after the last one that reads it,
// so no block can see a half-updated matrix. Loops over the batch or the
// classes are unrolled so their loads are in flight together: a phase is
// bound by load latency, not by arithmetic.
#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/fast_paths/whole_step/whole_step.hpp"
#include "ops/cuda/fast_paths/whole_step/whole_step_phases.cuh"
#include "ops/cuda/phase_marks.cuh"

namespace sg::cuda {
namespace {

// kBatch is a template argument so every loop over the batch has a constant
// trip count and unrolls: the phases are bound by load latency, and loads
// of an unrolled loop are in flight together. A: the hidden layers' activation.
template <bool kCluster, int kBatch, Activation A>
__global__ void __launch_bounds__(kBlockThreads, 1) whole_step_kernel(const WholeStepArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  Shared sh;
  shared_bytes(kBatch, a.dims[0], a.dims[a.layers - 1], a.dims[a.layers], &sh, smem);
  const int L = a.layers, C = a.dims[L];
  constexpr int B = kBatch;
  int phase = 0;
  mark_phase(a.phase_clock, phase++);

  fetch_batch(a, sh);
  __syncthreads();
  for (int l = 0; l + 1 < L; ++l) {
    forward_layer<A>(l == 0 ? sh.x : a.act[l - 1], a.weight[l], a.bias[l], a.act[l], a.pre[l], B, a.dims[l],
                     a.dims[l + 1], sh);
    phase_barrier<kCluster>();
    mark_phase(a.phase_clock, phase++);
  }
  // Every block: the logits, the softmax gradient (kept in shared memory for
  // the rest of the step), and its share of the last hidden layer's gradient.
  logits_in_block(L == 1 ? sh.x : a.act[L - 2], a.weight[L - 1], a.bias[L - 1], B, a.dims[L - 1], C, sh);
  softmax_xent(B, C, a.loss, sh);
  __syncthreads();
  if (L >= 2) logits_backward<A>(sh, a.weight[L - 1], saved_for_backward<A>(a, L - 2), a.grad[L - 2], B, C, a.dims[L - 1]);
  phase_barrier<kCluster>();  // the logits layer's W and b were read above: update them only now
  mark_phase(a.phase_clock, phase++);
  if (L == 1) {
    bias_update(sh.dlogits, a.bias[0], B, C, a.bias_sgd[0], grid_thread(), grid_threads(), a.bias_grad[0]);
    logits_weight_update(sh, sh.x, a.weight[0], B, C, a.dims[0], a.weight_sgd[0], (C + 31) / 32 * 32, a.weight_grad[0]);
  }

  for (int l = L - 2; l >= 0; --l) {  // grad[l] is complete
    // The dgrad takes blocks 0.. (one per 16 columns); the updates are laid
    // out after it in warp order so every task starts on idle blocks.
    std::int64_t warps_used = 0;
    if (l >= 1) {
      dgrad_layer<A>(a.grad[l], a.weight[l], saved_for_backward<A>(a, l - 1), a.grad[l - 1], B, a.dims[l + 1],
                     a.dims[l], sh);
      warps_used = std::int64_t(min(int(gridDim.x), a.dims[l] / 16)) * kWarps;
    }
    if (l + 1 == L - 1) {
      logits_weight_update(sh, a.act[l], a.weight[l + 1], B, C, a.dims[l + 1], a.weight_sgd[l + 1], warps_used * 32,
                           a.weight_grad[l + 1]);
      warps_used += (std::int64_t(C) * a.dims[l + 1] + 31) / 32;
      bias_update(sh.dlogits, a.bias[l + 1], B, C, a.bias_sgd[l + 1],
                  rotated(grid_thread(), grid_threads(), warps_used * 32), grid_threads(), a.bias_grad[l + 1]);
      warps_used += 1;
    } else {
      weight_update(a.grad[l + 1], a.act[l], a.weight[l + 1], B, a.dims[l + 2], a.dims[l + 1], a.weight_sgd[l + 1], sh,
                    warps_used, a.weight_grad[l + 1]);
      warps_used += std::int64_t(a.dims[l + 2] / 16) * (a.dims[l + 1] / 16);
    }
    bias_update(HalfReader{a.grad[l]}, a.bias[l], B, a.dims[l + 1], a.bias_sgd[l],
                rotated(grid_thread(), grid_threads(), warps_used * 32), grid_threads(), a.bias_grad[l]);
    warps_used += (a.dims[l + 1] + 31) / 32;
    if (l == 0) {
      weight_update(a.grad[0], sh.x, a.weight[0], B, a.dims[1], a.dims[0], a.weight_sgd[0], sh, warps_used,
                    a.weight_grad[0]);
    } else {
      phase_barrier<kCluster>();
      mark_phase(a.phase_clock, phase++);
    }
  }
  __syncthreads();
  mark_phase(a.phase_clock, phase++);  // block 0's own end: the others finish about then
  // Every block read the step counter in its fetch, several barriers ago.
  // With gradients out the update stage's launch reads it, then advances it.
  if (blockIdx.x == 0 && threadIdx.x == 0 && !a.gradients_out) *a.step += 1;
}

std::vector<std::string> per_step_phase_names(int layers) {
  std::vector<std::string> names;
  for (int l = 0; l + 1 < layers; ++l)
    names.push_back(l == 0 ? "fetch + layer 1 forward" : fmt::format("layer {} forward", l + 1));
  if (layers == 1) return {"fetch + logits + softmax-xent", "logits-layer SGD"};
  names.push_back(fmt::format("logits + softmax-xent + layer {} dgrad", layers));
  for (int l = layers - 2; l >= 0; --l)
    names.push_back(l >= 1 ? fmt::format("layer {} dgrad + layer {} SGD", l + 1, l + 2)
                           : fmt::format("layer 2 SGD + layer 1 SGD"));
  return names;
}

}  // namespace

std::vector<std::string> whole_step_phase_names(const WholeStepArgs& args, const WholeStepLaunch& launch) {
  return launch.resident ? resident_step_phase_names(args.layers) : per_step_phase_names(args.layers);
}

std::string whole_step_unsupported(const WholeStepArgs& a) {
  if (a.layers < 1 || a.layers > kWholeStepMaxLayers)
    return fmt::format("{} layers (1..{} supported)", a.layers, kWholeStepMaxLayers);
  if (a.batch % 16 != 0 || a.batch < 16 || a.batch > kWholeStepMaxBatch)
    return fmt::format("batch {} (a multiple of 16 up to {} supported)", a.batch, kWholeStepMaxBatch);
  for (int l = 0; l < a.layers; ++l)
    if (a.dims[l] % 16 != 0 || a.dims[l] <= 0)
      return fmt::format("layer width {} is not a multiple of 16", a.dims[l]);
  const int classes = a.dims[a.layers];
  if (classes < 1 || classes > kWholeStepMaxClasses)
    return fmt::format("{} classes (1..{} supported)", classes, kWholeStepMaxClasses);
  if (a.rows < a.batch) return "fewer dataset rows than one batch";
  const std::size_t smem = shared_bytes(a.batch, a.dims[0], a.dims[a.layers - 1], a.dims[a.layers]);
  if (smem > std::size_t(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)))
    return fmt::format("needs {} bytes of shared memory per block", smem);
  return {};
}

namespace {

using KernelFn = void (*)(WholeStepArgs);

template <bool kCluster>
KernelFn kernel_for(int batch, Activation activation) {
  return with_activation(activation, [&](auto act) -> KernelFn {
    constexpr Activation A = decltype(act)::value;
    switch (batch) {
      case 16: return whole_step_kernel<kCluster, 16, A>;
      case 32: return whole_step_kernel<kCluster, 32, A>;
      case 48: return whole_step_kernel<kCluster, 48, A>;
      case 64: return whole_step_kernel<kCluster, 64, A>;
    }
    throw CudaError(fmt::format("whole_step_kernel: no instance for batch {}", batch));
  });
}

// Blocks the widest phase can keep busy: more only make barriers dearer.
std::int64_t useful_blocks(const WholeStepArgs& a) {
  std::int64_t want = (std::int64_t(a.batch) * a.dims[a.layers] + kWarps - 1) / kWarps;  // logits: a warp each
  for (int l = 0; l < a.layers; ++l) {
    want = std::max<std::int64_t>(want, a.dims[l + 1] / 16);  // forward tiles
    want = std::max<std::int64_t>(want, a.dims[l] / 16);      // dgrad tiles
    want = std::max<std::int64_t>(want, (std::int64_t(a.dims[l + 1] / 16) * (a.dims[l] / 16) + kWarps - 1) / kWarps);
  }
  return want;
}

// The largest cluster (16, else 8) of which one fits on this GPU; 0 if none.
int largest_cluster(KernelFn kernel, std::size_t smem) {
  for (int size : {16, 8}) {
    cudaLaunchAttribute attr{};
    const cudaLaunchConfig_t cfg = one_cluster_config(size, kBlockThreads, smem, nullptr, attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0)
      return size;
    (void)cudaGetLastError();  // a refused size is an answer, not an error
  }
  return 0;
}

}  // namespace

WholeStepLaunch plan_whole_step_launch(const WholeStepArgs& a, int steps_per_launch, const WholeStepChoice& choice) {
  int per_sm = 0;
  const int sms = multiprocessor_count(), major = current_device_attribute(cudaDevAttrComputeCapabilityMajor);
  const std::size_t smem = shared_bytes(a.batch, a.dims[0], a.dims[a.layers - 1], a.dims[a.layers]);
  if (backward_reads_input(a.activation))
    for (int l = 0; l + 1 < a.layers; ++l)
      if (!a.pre[l])
        throw CudaError(fmt::format("whole_step_kernel: {}'s backward needs hidden layer {}'s pre-activation",
                                    activation_op_name(a.activation), l + 1));
  const KernelFn grid_kernel = kernel_for<false>(a.batch, a.activation);
  SG_CUDA_CHECK(cudaFuncSetAttribute(grid_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  SG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_kernel, kBlockThreads, smem));
  if (per_sm < 1) throw CudaError("whole_step_kernel: no block fits on a multiprocessor");
  const std::int64_t want = useful_blocks(a);
  WholeStepLaunch grid{int(std::min<std::int64_t>(want, std::int64_t(sms) * per_sm)), false};

  const WholeStepVariant mode = choice.variant;
  if (mode == WholeStepVariant::grid || major < 9) return grid;
  if (((mode == WholeStepVariant::automatic && steps_per_launch > 1) || mode == WholeStepVariant::resident) &&
      resident_step_unsupported(a, choice.resident_cluster).empty()) {
    WholeStepLaunch resident;
    resident.resident = true;
    resident.layout = plan_resident_layout(a, choice.resident_cluster);
    resident.blocks = resident.layout.cluster;
    resident.cluster = true;
    return resident;
  }
  const KernelFn cluster_kernel = kernel_for<true>(a.batch, a.activation);
  SG_CUDA_CHECK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  SG_CUDA_CHECK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  const int cluster = largest_cluster(cluster_kernel, smem);
  if (cluster == 0) return grid;
  // Measured on an H100 (docs/performance.md): one cluster is no faster than
  // the grid at width 128 and slower from 256 up, so it runs only on request.
  if (mode == WholeStepVariant::cluster) return {int(std::min<std::int64_t>(want, cluster)), true};
  return grid;
}

void launch_whole_step(const WholeStepArgs& args, const WholeStepLaunch& launch, cudaStream_t stream, int steps) {
  if (launch.blocks < 1) throw CudaError("whole_step_kernel: launched with no blocks");
  if (launch.resident) {
    launch_resident_steps(args, launch.layout, steps, stream);
    return;
  }
  for (int s = 1; s < steps; ++s) launch_whole_step(args, launch, stream, 1);
  const std::size_t smem = shared_bytes(args.batch, args.dims[0], args.dims[args.layers - 1], args.dims[args.layers]);
  if (launch.cluster) {
    cudaLaunchAttribute attr{};
    const cudaLaunchConfig_t cfg = one_cluster_config(launch.blocks, kBlockThreads, smem, stream, attr);
    SG_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel_for<true>(args.batch, args.activation), args));
    return;
  }
  void* params[] = {const_cast<WholeStepArgs*>(&args)};
  SG_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel_for<false>(args.batch, args.activation)),
                                            dim3(unsigned(launch.blocks)), dim3(kBlockThreads), params, smem, stream));
}

}  // namespace sg::cuda
