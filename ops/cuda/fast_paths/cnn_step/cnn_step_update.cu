// Kernel 2 of the CNN step (cnn_step.hpp): the blocks' gradient slices (or
// the examples' linear-layer factors) summed in a fixed order, the update of
// the fp32 master weights by SGD (sgd_step.cuh) or by any update rule
// (update_rules/), their fp16 or bf16 casts into the parameter image, the batch's
// mean loss and the step advance, or (data parallel) the summed gradients
// stored for the update stage; and the kernel that rebuilds the image from
// the fp32 parameters.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/cnn_step/cnn_step.hpp"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_parts.hpp"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_shapes.cuh"
#include "ops/cuda/phase_marks.cuh"
#include "ops/cuda/sgd_step.cuh"
#include "ops/cuda/update_rules/all_rules.cuh"
#include "ops/cuda/update_rules/each_slot.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

// Where tensor t's elements sit in the parameter image: element i of a conv
// weight [co][ci][tap] (a linear one [out][in], as one tap) at 16-bit element
// forward + co * forward_stride + (ci, tap), and where the layer computes
// its input gradient also at element data + ci * data_stride + co * taps + tap;
// a bias element at float bias + i. Offsets from the image's start.
struct ImageTarget {
  int forward = -1, data = -1, bias = -1;
  int row = 1, taps = 1, forward_stride = 0, data_stride = 0;
};

__host__ __device__ inline ImageTarget image_target(const CnnStepArgs& a, const CnnStepLaunch& l, int t) {
  ImageTarget x;
  for (int li = 0; li < a.layers; ++li) {
    const CnnLayer& L = a.layer[li];
    if (!has_parameters(L)) continue;
    if (L.bias == t) x.bias = l.bias_offset[li] - l.image_offset;
    if (L.weight != t) continue;
    const bool conv = L.op == CnnLayerOp::conv2d;
    x.row = conv ? L.in_c * L.kernel_h * L.kernel_w : L.in_c * L.in_h * L.in_w;
    x.taps = conv ? L.kernel_h * L.kernel_w : 1;
    x.forward = 2 * (l.weight_offset[li] - l.image_offset);
    x.forward_stride = conv ? forward_stride(L) : x.row;
    if (conv && L.input_gradient) {
      x.data = 2 * (l.weight_t_offset[li] - l.image_offset);
      x.data_stride = data_stride(L);
    }
  }
  return x;
}

// Element i of a tensor, `value` (its fp32 master), into the image as the
// graph's cast makes it: fp16 (bf16) weights, biases rounded to fp16 (bf16)
// values; T is the compute dtype's element.
template <class T>
__device__ __forceinline__ void store_in_image(float* image, const ImageTarget& x, int i, float value) {
  if (x.bias >= 0) {
    image[x.bias + i] = rounded<T>(value);
    return;
  }
  auto* h = reinterpret_cast<T*>(image);
  const T v = to_compute<T>(value);
  const int co = i / x.row, r = i - co * x.row;
  h[x.forward + co * x.forward_stride + r] = v;
  if (x.data >= 0) {
    const int ci = r / x.taps, tap = r - ci * x.taps;
    h[x.data + ci * x.data_stride + co * x.taps + tap] = v;
  }
}
__device__ __forceinline__ void store_in_image(float* image, const ImageTarget& x, int i, float value, bool bf16) {
  if (bf16) store_in_image<__nv_bfloat16>(image, x, i, value);
  else store_in_image<__half>(image, x, i, value);
}

// kSumParts lanes per parameter element, each summing a contiguous part of
// the blocks' slices (or of the examples' factor products) with all its
// loads in flight, so the sum is one round trip to L2 instead of one per few
// loads (3.9 us of a 56 us step at batch 64, with one lane summing all 64
// slices eight loads at a time).
constexpr int kSumParts = 4;
static_assert(kSumParts == 4, "cnn_step_update's two shuffles add four parts");

// Where tensor t's gradient comes from (CnnStepLaunch): a conv tensor's
// element i from i + `slice` of every block's slice; a linear weight's
// element (j, c) of its `row`-wide rows from the sum over the examples of
// dZ[j] x[c], with dZ at `factor` of an example's factor row and x at
// factor + input_at; a linear bias's element j from the sum of dZ[j] (row 0).
struct GradientSource {
  int slice = -1, factor = -1, input_at = 0, row = 0;
};

inline __host__ __device__ GradientSource gradient_source(const CnnStepArgs& a, const CnnStepLaunch& l, int t) {
  GradientSource x;
  x.slice = l.slice_offset[t];
  if (x.slice >= 0) return x;
  for (int li = 0; li < a.layers; ++li) {
    const CnnLayer& L = a.layer[li];
    if (L.op != CnnLayerOp::linear || (L.weight != t && L.bias != t)) continue;
    x.factor = l.factor_offset[li];
    if (L.weight == t) {
      x.input_at = L.out_c;
      x.row = L.in_c * L.in_h * L.in_w;
    }
  }
  return x;
}

// Element i's part of its batch gradient: slices or examples [k0, k1).
__device__ __forceinline__ float gradient_part(const CnnStepArgs& a, const CnnStepLaunch& l, const GradientSource& x,
                                               int blocks, int i, int k0, int k1) {
  float sum = 0.f;
  if (x.slice >= 0) {
    const float* g = a.workspace + std::int64_t(k0) * l.slice_floats + x.slice + i;
#pragma unroll 16
    for (int k = k0; k < k1; ++k, g += l.slice_floats) sum += *g;
    return sum;
  }
  const float* f = a.workspace + std::int64_t(blocks) * l.slice_floats + std::int64_t(k0) * l.factor_floats + x.factor;
  if (x.row == 0) {
#pragma unroll 16
    for (int k = k0; k < k1; ++k, f += l.factor_floats) sum += f[i];
    return sum;
  }
  const int j = i / x.row, c = x.input_at + i - j * x.row;
#pragma unroll 16
  for (int k = k0; k < k1; ++k, f += l.factor_floats) sum += f[j] * f[c];
  return sum;
}

// The tensors' pointers, ranges, gradient sources and image targets in
// shared memory, once per block: indexing the kernel parameters' arrays per
// element is slow.
struct TensorTable {
  std::int64_t offset[kCnnStepMaxTensors + 1];
  float* param[kCnnStepMaxTensors];
  float* velocity[kCnnStepMaxTensors];
  float* gradient_out[kCnnStepMaxTensors];
  const UpdateScalars* scalars[kCnnStepMaxTensors];
  GradientSource source[kCnnStepMaxTensors];
  ImageTarget target[kCnnStepMaxTensors];
  __device__ int tensor_of(std::int64_t e) const {
    int t = 0;
    while (e >= offset[t + 1]) ++t;
    return t;
  }
};

// The block's tensor table, declared in a function that is no template: nvcc
// refuses a __shared__ variable of a type with member initialisers in a kernel
// template ("dynamic initialization"), and none runs in shared memory anyway.
__device__ __forceinline__ TensorTable& block_tensor_table() {
  __shared__ TensorTable table;
  return table;
}

__device__ void load_tensor_table(TensorTable& table, const CnnStepArgs& a, const CnnStepLaunch& l) {
  for (int t = threadIdx.x; t <= a.tensors; t += blockDim.x) {
    table.offset[t] = a.param_offset[t];
    if (t < a.tensors) {
      table.param[t] = a.param[t];
      table.velocity[t] = a.velocity[t];
      table.gradient_out[t] = a.gradient_out[t];
      table.scalars[t] = a.scalars[t];
      table.source[t] = gradient_source(a, l, t);
      table.target[t] = image_target(a, l, t);
    }
  }
  __syncthreads();
}

// How kernel 2 updates an element: SGD from the tensor's velocity and
// scalars (InKernelSgd), an update rule from its state slots (RuleUpdate), or
// not at all: the gradient is stored for the update stage (GradientsOut).
struct InKernelSgd {};
struct GradientsOut {};
template <class R>
struct RuleUpdate {
  using Rule = R;
  HyperOf<Rule> hyper;
  CnnStepRuleState state;
};

// The rule's state pointers in shared memory, as the tensor table (none for SGD).
template <class Update>
struct StateTable {
  __device__ void load(const Update&, int) {}
};
template <class Rule>
struct StateTable<RuleUpdate<Rule>> {
  float* slot[kCnnStepMaxTensors][kMaxUpdateStates];  // (a plain array: no initialiser in shared memory)
  __device__ void load(const RuleUpdate<Rule>& u, int tensors) {
    for (int t = threadIdx.x; t < tensors; t += blockDim.x)
      for (int s = 0; s < kMaxUpdateStates; ++s) slot[t][s] = u.state.tensor[t].slot[s];
    __syncthreads();
  }
};

// Launched as a dependent of kernel 1 (where the backend allows it), so its
// blocks are resident and have read what kernel 1 does not write (weights,
// velocities or rule states, update scalars, the step counter) when kernel 1
// ends: after that an element costs one round of loads, its gradient's
// parts, all in flight. The grid has one lane per part of every element
// (element_blocks), and one block more, the last, for the batch's mean loss
// and the step advance (with GradientsOut the update stage's, after its updates).
template <class Update>
__global__ void __launch_bounds__(kUpdateThreads)
    cnn_step_update(const __grid_constant__ CnnStepArgs a, const __grid_constant__ CnnStepLaunch l, int blocks,
                    int phase, const __grid_constant__ Update u) {
  constexpr bool kSgd = std::is_same_v<Update, InKernelSgd>;
  constexpr bool kOut = std::is_same_v<Update, GradientsOut>;
  if (blockIdx.x == gridDim.x - 1) {
    if (threadIdx.x >= 32) return;
    const std::int32_t step = *a.step;  // written only by the previous step's update
    wait_for_previous_kernel();
    const float* example_loss = example_losses(a, l, blocks);
    float sum = 0.f;
    for (int i = threadIdx.x; i < a.batch; i += 32) sum += example_loss[i];
    sum = warp_sum(sum);
    if (threadIdx.x == 0) {
      *a.loss = sum / float(a.batch);
      if constexpr (!kOut) *a.step = step + 1;  // else the update stage's step advance, after its updates
    }
    return;
  }
  TensorTable& table = block_tensor_table();
  __shared__ StateTable<Update> states;
  load_tensor_table(table, a, l);
  states.load(u, a.tensors);
  const std::int64_t elements = table.offset[a.tensors];
  const int part = threadIdx.x % kSumParts;
  const std::int64_t e = (blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) / kSumParts;
  const int t = e < elements ? table.tensor_of(e) : 0;
  const int i = int(e - table.offset[t]);
  const bool updates = part == 0 && e < elements;  // the lane that updates element e
  float* const velocity = table.velocity[t];
  float w = 0.f, v = 0.f;
  float state[kMaxUpdateStates] = {};  // an update rule's slots of element i
  UpdateScalars scalars{};
  if (updates && !kOut) {
    w = table.param[t][i];
    if (velocity) v = velocity[i];
    if constexpr (!kSgd && !kOut)
      each_slot<typename Update::Rule>(u.hyper, [&](auto s) { state[s.value] = states.slot[t][s.value][i]; });
    scalars = *table.scalars[t];
  }
  wait_for_previous_kernel();
  mark_phase(a.phase_clock, phase, true);
  const GradientSource& source = table.source[t];
  const int parts_of = source.slice >= 0 ? blocks : a.batch;  // slices or examples
  const float part_sum = e < elements ? gradient_part(a, l, source, blocks, i, part * parts_of / kSumParts,
                                                      (part + 1) * parts_of / kSumParts)
                                      : 0.f;
  // The parts' sums in one order for every element: (p0 + p1) + (p2 + p3).
  float sum = part_sum + __shfl_xor_sync(0xffffffffu, part_sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  const float gradient = rounded(sum, a.bf16);  // as the graph's wgrad value
  if (updates && kOut) table.gradient_out[t][i] = gradient;
  if (updates && !kOut) {
    if constexpr (kSgd) {
      w = a.nesterov && velocity ? sgd_nesterov_step(w, gradient, v, scalars)
                                 : sgd_step(w, gradient, velocity != nullptr, v, scalars);
    } else if constexpr (!kOut) {
      const typename Update::Rule rule(u.hyper, scalars.lr, step_at_start(a, l, blocks), nullptr);
      w = rule(w, gradient, [&](int s) -> float& { return state[s]; });
    }
    table.param[t][i] = w;
    if constexpr (kSgd) {
      if (velocity) velocity[i] = v;
    } else if constexpr (!kOut) {
      each_slot<typename Update::Rule>(u.hyper, [&](auto s) { states.slot[t][s.value][i] = state[s.value]; });
    }
    store_in_image(a.image, table.target[t], i, w, a.bf16);
  }
  __syncthreads();
  mark_phase(a.phase_clock, phase + 1, true);
}

// The parameter image from the fp32 parameters (launch_cnn_step_image).
__global__ void __launch_bounds__(kUpdateThreads)
    cnn_step_build_image(const __grid_constant__ CnnStepArgs a, const __grid_constant__ CnnStepLaunch l) {
  __shared__ TensorTable table;
  load_tensor_table(table, a, l);
  const std::int64_t elements = table.offset[a.tensors];
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < elements;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const int t = table.tensor_of(e);
    const int i = int(e - table.offset[t]);
    store_in_image(a.image, table.target[t], i, table.param[t][i], a.bf16);
  }
}

// Blocks of kUpdateThreads for `lanes_per_element` lanes per parameter element.
int element_blocks(const CnnStepArgs& a, int lanes_per_element) {
  const std::int64_t threads = std::int64_t(a.param_offset[a.tensors]) * lanes_per_element;
  return int(std::max<std::int64_t>(1, (threads + kUpdateThreads - 1) / kUpdateThreads));
}

template <class Update>
void launch_update(const CnnStepArgs& a, const CnnStepLaunch& l, const Update& u, cudaStream_t stream,
                   bool dependent) {
  const int update_phase = a.phase_clock ? static_cast<int>(cnn_step_phase_names(a).size()) - 1 : 0;
  launch_dependent(cnn_step_update<Update>,
                   LaunchGeometry{dim3(element_blocks(a, kSumParts) + 1), dim3(kUpdateThreads)}, stream, dependent, a,
                   l, l.blocks, update_phase, u);
}

}  // namespace

void launch_cnn_step_image(const CnnStepArgs& a, const CnnStepLaunch& l, cudaStream_t stream) {
  SG_CUDA_CHECK(cudaMemsetAsync(a.image, 0, cnn_step_image_bytes(l), stream));  // every padding zero
  cnn_step_build_image<<<element_blocks(a, 1), kUpdateThreads, 0, stream>>>(a, l);
  SG_LAUNCH_CHECK("cnn_step_build_image");
}

void launch_cnn_step(const CnnStepArgs& a, const CnnStepLaunch& l, cudaStream_t stream, bool dependent) {
  cnn_step_parts::launch_cnn_step_examples(a, l, stream);
  launch_update(a, l, InKernelSgd{}, stream, dependent);
}

void launch_cnn_step_gradients(const CnnStepArgs& a, const CnnStepLaunch& l, cudaStream_t stream, bool dependent) {
  // The image's paddings stay zero from launch_cnn_step_image; its values are the parameters' casts.
  cnn_step_build_image<<<element_blocks(a, 1), kUpdateThreads, 0, stream>>>(a, l);
  SG_LAUNCH_CHECK("cnn_step_build_image");
  cnn_step_parts::launch_cnn_step_examples(a, l, stream);
  launch_update(a, l, GradientsOut{}, stream, dependent);
}

template <class Rule>
void launch_cnn_step(const CnnStepArgs& a, const CnnStepLaunch& l, const CnnStepRuleState& state, HyperOf<Rule> hyper,
                     cudaStream_t stream, bool dependent) {
  cnn_step_parts::launch_cnn_step_examples(a, l, stream);
  launch_update(a, l, RuleUpdate<Rule>{hyper, state}, stream, dependent);
}

#define SG_CNN_STEP_RULE(Rule)                                                                                \
  template void launch_cnn_step<Rule>(const CnnStepArgs&, const CnnStepLaunch&, const CnnStepRuleState&,     \
                                      HyperOf<Rule>, cudaStream_t, bool);
SG_FOR_EACH_UPDATE_RULE(SG_CNN_STEP_RULE)
#undef SG_CNN_STEP_RULE
}  // namespace sg::cuda
