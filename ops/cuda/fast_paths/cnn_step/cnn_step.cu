// The CNN training step in two kernels (cnn_step.hpp says why). Kernel 1
// reads top to bottom as one example's step: copy the arguments, the conv
// GEMMs' index tables and the parameter image (the weights as the layers
// read them) into shared memory (once per block), fetch, each layer's
// forward, the loss, each layer's backward in reverse, with a barrier
// between layers. Convolutions are implicit GEMMs on tensor cores whose
// operands are gathered from the activations through index tables and whose
// work is cut evenly over the warps; everything else is a plain loop over
// the layer's elements.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/cnn_step/cnn_step.hpp"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_conv.cuh"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_layers.cuh"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_parts.hpp"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_shapes.cuh"
#include "ops/cuda/phase_marks.cuh"
#include "ops/cuda/softmax_row.cuh"

namespace sg::cuda {
namespace {

// T: the compute dtype's element (__half or __nv_bfloat16; CnnStepArgs::bf16).
template <class T>
__global__ void __launch_bounds__(kExampleThreads, 1)
    cnn_step_examples(const __grid_constant__ CnnStepArgs args, const __grid_constant__ CnnStepLaunch launch) {
  extern __shared__ float4 shared4[];
  __shared__ SharedArguments arguments;
  Block b{reinterpret_cast<float*>(shared4), int(threadIdx.x), int(blockDim.x), int(threadIdx.x) / 32,
          int(threadIdx.x) % 32, int(blockDim.x) / 32};
  mark_phase(args.phase_clock, 0, true);
  allow_next_kernel_to_start();  // the update kernel's blocks wait on the free SMs (cnn_step_update)
  // The first layer's part of the image, the arguments, the first example's
  // fetch, then the rest of the image: the fetch is three loads in turn (step
  // counter, permutation, pixels), each waiting behind every copy issued before
  // it, and the rest of the image arrives while the first layers run. Until
  // the barrier below, the kernel parameters are read as the arguments' copy
  // and otherwise only in fields every thread reads alike.
  copy_image_part(b, args, launch, 0);
  constexpr std::size_t kLayersAt = offsetof(CnnStepArgs, layer), kAfterLayers = offsetof(CnnStepArgs, tensors);
  copy_words(b, &args, &arguments.args, kLayersAt + std::size_t(args.layers) * sizeof(CnnLayer));
  copy_words(b, reinterpret_cast<const char*>(&args) + kAfterLayers,
             reinterpret_cast<char*>(&arguments.args) + kAfterLayers, sizeof(CnnStepArgs) - kAfterLayers);
  copy_words(b, &launch, &arguments.launch, sizeof(CnnStepLaunch));
  const std::int32_t step = *args.step;
  int label = fetch_example<T>(b, args, launch, step, blockIdx.x);
  for (int p = 1; p < kImageParts; ++p) copy_image_part(b, args, launch, p);
  for (int i = b.tid; i < launch.zeroed_floats; i += b.threads) b.smem[launch.zeroed_offset + i] = 0.f;
  static_assert(kImageParts == 3, "the waits below and in layer_ready count three groups");
  wait_copies<2>();
  __syncthreads();
  mark_phase(args.phase_clock, 1, true);
  if (blockIdx.x == 0 && b.tid == 0) *step_at_start(args, launch, gridDim.x) = step;
  const CnnStepArgs& a = arguments.args;
  const CnnStepLaunch& l = arguments.launch;
  float* const smem = b.smem;
  const auto table = [&](int offset) { return reinterpret_cast<const int2*>(smem + offset); };
  const auto weights = [&](int li) { return reinterpret_cast<const T*>(smem + l.weight_offset[li]); };
  const auto keep_mask = [&](int li) { return reinterpret_cast<bool*>(smem + l.mask_offset[li]); };
  float* const slots = smem + l.reduce_offset;  // the conv GEMMs' slots; a linear layer's gradient through its ReLU
  float* const grads = a.workspace + std::int64_t(blockIdx.x) * l.slice_floats;  // this block's slice
  float* const factors = factor_rows(a, l, gridDim.x);
  float* const example_loss = example_losses(a, l, gridDim.x);
  const int classes = a.layer[a.layers - 1].out_c;

  for (int example = blockIdx.x; example < a.batch; example += gridDim.x) {
    const bool first = example == int(blockIdx.x);
    int phase = 2;
    if (!first) {  // (the first was fetched with the arguments)
      label = fetch_example<T>(b, a, l, step, example);
      __syncthreads();
    }

    for (int li = 0; li < a.layers; ++li) {
      if (first) layer_ready(l, li);
      if (l.relu[li] == kReluRunByLayerBefore) continue;  // the layer before ran it
      const CnnLayer L = a.layer[li];  // a copy in registers
      const bool with_relu = l.relu[li] == kReluAfter;
      const float* in = smem + l.act_offset[li];
      float* out = smem + l.act_offset[li + (with_relu ? 2 : 1)];
      const int n = L.out_c * L.out_h * L.out_w;
      switch (L.op) {
        case CnnLayerOp::conv2d:
          if (L.padding > 0)
            conv_forward<T, true>(b, L, in, out, weights(li), smem + l.bias_offset[li], table(l.windows_offset[li]),
                               table(l.taps_offset[li]), slots);
          else
            conv_forward<T, false>(b, L, in, out, weights(li), smem + l.bias_offset[li], table(l.windows_offset[li]),
                                table(l.taps_offset[li]), slots);
          break;
        case CnnLayerOp::max_pool2d: max_pool_forward(b, L, in, out, with_relu); break;
        case CnnLayerOp::relu:
          for (int i = b.tid; i < n; i += b.threads) out[i] = in[i] > 0.f ? in[i] : 0.f;
          break;
        case CnnLayerOp::activation:
          with_activation(L.activation, [&](auto act) { activation_forward_as<T, act.value>(b, n, in, out); });
          break;
        case CnnLayerOp::dropout:  // the keep bits stay for the backward (keep_mask)
          for (int i = b.tid; i < n; i += b.threads) {
            const bool keep = kept(L, example, i, step);
            keep_mask(li)[i] = keep;
            out[i] = keep ? rounded<T>(in[i] * L.dropout.scale) : 0.f;
          }
          break;
        case CnnLayerOp::dropout2d: {  // one draw per channel
          const int plane = L.out_h * L.out_w;
          for (int c = b.tid; c < L.out_c; c += b.threads) keep_mask(li)[c] = kept(L, example, c * plane, step);
          __syncthreads();
          for (int i = b.tid; i < n; i += b.threads)
            out[i] = keep_mask(li)[i / plane] ? rounded<T>(in[i] * L.dropout.scale) : 0.f;
          break;
        }
        case CnnLayerOp::linear: linear_forward(b, L, in, out, weights(li), smem + l.bias_offset[li], with_relu); break;
        case CnnLayerOp::view: break;  // same bytes (act_offset aliases them)
      }
      __syncthreads();
      if (L.op != CnnLayerOp::view) mark_phase(a.phase_clock, phase++, first);
    }

    // Softmax cross-entropy of the logits and their gradient (softmax - onehot) * (gradient_scale / batch).
    float* g = smem + l.grad_offset[0];
    if (b.warp == 0) {  // (softmax_row.cuh, as the xent kernel computes them)
      const float inv_rows = a.gradient_scale / float(a.batch);
      const float loss = softmax_xent_lanes_to<32>(smem + l.act_offset[a.layers], classes, label, inv_rows, true,
                                                   [&](std::int64_t j, float v) { g[j] = rounded<T>(v); });
      if (b.lane == 0) example_loss[example] = loss;
    }
    __syncthreads();
    mark_phase(a.phase_clock, phase++, first);

    int cur = 0;
    for (int li = a.layers; li-- > 0;) {
      const CnnLayer L = a.layer[li];  // a copy in registers
      if (L.op == CnnLayerOp::view) continue;  // the gradient's bytes are the input gradient's
      if (l.relu[li] == kReluRunByLayerBefore) continue;  // the layer before takes the gradient through it
      const float* relu_out = l.relu[li] == kReluAfter ? smem + l.act_offset[li + 2] : nullptr;
      const float* in = smem + l.act_offset[li];
      const float* out = smem + l.act_offset[li + 1];
      g = smem + l.grad_offset[cur];
      float* g_in = smem + l.grad_offset[1 - cur];
      const int n = L.in_c * L.in_h * L.in_w;
      switch (L.op) {
        case CnnLayerOp::conv2d:
        {
          // dY^T's rows of T: in the input gradient's buffer until that is written, where they fit
          float* const scratch = l.dy_offset < 0 ? g_in : smem + l.dy_offset;
          float* const dW = grads + l.slice_offset[L.weight];
          float* const db = grads + l.slice_offset[L.bias];
          const int2* windows = table(l.windows_offset[li]);
          const int2* taps = table(l.taps_offset[li]);
          if (L.padding > 0) conv_weight_gradient<T, true>(b, L, g, in, windows, taps, scratch, slots, dW, db, first);
          else conv_weight_gradient<T, false>(b, L, g, in, windows, taps, scratch, slots, dW, db, first);
          if (L.input_gradient) {
            __syncthreads();  // the weight gradient reads its tables and scratch until here
            mark_phase(a.phase_clock, phase++, first);
            const auto* wt = reinterpret_cast<const T*>(smem + l.weight_t_offset[li]);
            conv_data_gradient(b, L, g, smem + l.border_offset[li], g_in, wt, table(l.data_rows_offset[li]),
                               table(l.data_columns_offset[li]), slots);
          }
        }
          break;
        case CnnLayerOp::linear: {
          const bool factored = l.factor_offset[li] >= 0;  // else its tensors are in the block's slice
          linear_backward(b, L, g, in, g_in, weights(li),
                          factored ? factors + std::int64_t(example) * l.factor_floats + l.factor_offset[li] : nullptr,
                          factored ? nullptr : grads + l.slice_offset[L.weight],
                          factored ? nullptr : grads + l.slice_offset[L.bias], first, relu_out, slots);
          break;
        }
        case CnnLayerOp::max_pool2d: max_pool_backward<T>(b, L, g, in, g_in, relu_out); break;
        case CnnLayerOp::relu:
          for (int i = b.tid; i < n; i += b.threads) g_in[i] = out[i] > 0.f ? g[i] : 0.f;
          break;
        case CnnLayerOp::activation:
          with_activation(L.activation,
                          [&](auto act) { activation_backward_as<T, act.value>(b, n, g, in, out, g_in); });
          break;
        case CnnLayerOp::dropout:
          for (int i = b.tid; i < n; i += b.threads)
            g_in[i] = keep_mask(li)[i] ? rounded<T>(g[i] * L.dropout.scale) : 0.f;
          break;
        case CnnLayerOp::dropout2d: {
          const int plane = L.out_h * L.out_w;
          for (int i = b.tid; i < n; i += b.threads)
            g_in[i] = keep_mask(li)[i / plane] ? rounded<T>(g[i] * L.dropout.scale) : 0.f;
          break;
        }
        case CnnLayerOp::view: break;
      }
      __syncthreads();
      mark_phase(a.phase_clock, phase++, first);
      if ((L.op == CnnLayerOp::conv2d || L.op == CnnLayerOp::linear) && !L.input_gradient) break;
      cur = 1 - cur;
    }
  }
}

// Shared memory a block may have beyond the kernel's static arguments copy.
std::size_t dynamic_shared_limit() {
  int device = 0, limit = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  SG_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  SG_CUDA_CHECK(cudaFuncGetAttributes(&attributes, cnn_step_examples<__half>));  // (the same for bf16)
  return std::size_t(limit) - attributes.sharedSizeBytes;
}

}  // namespace

using cnn_step_parts::plan_gradients;
using cnn_step_parts::shared_layout;
using cnn_step_parts::SharedLayout;

std::string cnn_step_unsupported(const CnnStepArgs& a) {
  if (a.layers < 1 || a.layers > kCnnStepMaxLayers) return fmt::format("{} layers (1 to {})", a.layers, kCnnStepMaxLayers);
  if (a.tensors > kCnnStepMaxTensors) return fmt::format("{} parameter tensors (at most {})", a.tensors, kCnnStepMaxTensors);
  if (a.batch < 1 || a.ranks < 1 || a.rank < 0 || a.rank >= a.ranks || a.rows < std::int64_t(a.batch) * a.ranks)
    return "fewer rows than a (global) batch";
  const std::size_t bytes = shared_layout(a).bytes, limit = dynamic_shared_limit();
  if (bytes > limit)
    return fmt::format("an example's activations, weights and work space need {} bytes of shared memory (the GPU "
                       "has {} beyond the step's arguments)",
                       bytes, limit);
  return {};
}

CnnStepLaunch plan_cnn_step_launch(const CnnStepArgs& a) {
  const SharedLayout s = shared_layout(a);
  const auto kernel = a.bf16 ? cnn_step_examples<__nv_bfloat16> : cnn_step_examples<__half>;
  SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(s.bytes)));
  int device = 0, sms = 0, per_sm = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  SG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  SG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kExampleThreads, s.bytes));
  // Every block resident at once, each taking the same number of examples.
  const int resident = std::max(1, sms * std::max(1, per_sm));
  const int per_block = (a.batch + resident - 1) / resident;
  CnnStepLaunch launch = s.launch;
  launch.blocks = (a.batch + per_block - 1) / per_block;
  plan_gradients(a, per_block, launch);
  return launch;
}

namespace cnn_step_parts {

void launch_cnn_step_examples(const CnnStepArgs& a, const CnnStepLaunch& l, cudaStream_t stream) {
  if (a.bf16)
    cnn_step_examples<__nv_bfloat16><<<l.blocks, l.threads, l.shared_bytes, stream>>>(a, l);
  else
    cnn_step_examples<__half><<<l.blocks, l.threads, l.shared_bytes, stream>>>(a, l);
  SG_LAUNCH_CHECK("cnn_step_examples");
}

}  // namespace cnn_step_parts

}  // namespace sg::cuda
