#pragma once
// The whole training step of a small sequential CNN (issue 22) as two
// kernels instead of ~26 launches:
//   1. per example, one thread block: fetch the image row, run every layer's
//      forward with all activations in shared memory, the softmax
//      cross-entropy, and every layer's backward; the block adds the
//      example's conv weight and bias gradients to its own slice of a
//      workspace (a block takes examples k, k + blocks, ...; no atomics, so
//      the sums have one order and every run gives the same bits); of a
//      linear layer, whose example gradient is the outer product dZ x^T, it
//      stores the two factors, dZ and x, per example;
//   2. per parameter element: the blocks' slices, or the products of the
//      examples' factors, summed in a fixed order, the
//      gradient rounded to the compute dtype as the graph's wgrad value is,
//      the update of the fp32 master weight, the batch's mean loss and the
//      step advance. The update is the update stage's (docs/design.md, "The
//      update stage"): kernel 1's slices and factors are the per-block
//      partial gradients, and kernel 2 applies any update rule
//      (ops/cuda/update_rules/) to their sums, or SGD (momentum, weight
//      decay; ops/cuda/sgd_step.cuh, as every SGD kernel). It also writes
//      the new weights' fp16 or bf16 casts (the graph's cast nodes) into the
//      parameter image: the layouts kernel 1's
//      layers read, which every block of the next step copies into its
//      shared memory as they are (built per block from the fp32 weights,
//      they took 8 of a step's 56 us at batch 64).
// At the report CNN's sizes an example's layers are a few hundred thousand
// multiply-adds: too small to fill a GPU per layer, where every launch costs
// more than its work, but one block each keeps every SM busy for the step.
// Every intermediate is rounded to fp16 (bf16) where the graph has an fp16 (bf16) value, so
// this follows the per-launch schedule's math (tests compare both with the
// CPU backend). Dropout and dropout2d draw the same Philox bits as theirs.
//
// The image is state derived from the parameters: whoever writes the fp32
// parameters other than these kernels (initialisation, a resumed checkpoint)
// rebuilds it with launch_cnn_step_image (CudaProgram::parameters_written).
//
// Files: cnn_step.cu (kernel 1; its convolutions in cnn_step_conv.cuh, its
// other layers in cnn_step_layers.cuh), cnn_step_update.cu (kernel 2 and the
// image rebuild), cnn_step_layout.cu (the host-side layout), what they share
// in cnn_step_shapes.cuh and cnn_step_parts.hpp.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/cuda/activation.hpp"
#include "ops/cuda/dropout.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/update_rules/update_rule.hpp"

namespace sg::cuda {

constexpr int kCnnStepMaxLayers = 24;
constexpr int kCnnStepMaxTensors = 16;
constexpr int kImageParts = 3;

// relu apart from the other activations (activation, CnnLayer::activation):
// a ReLU after a pooling or linear layer runs inside it (CnnStepLaunch::relu).
enum class CnnLayerOp : std::uint8_t { conv2d, max_pool2d, relu, dropout2d, dropout, view, linear, activation };

// One per-example layer: [in_c, in_h, in_w] -> [out_c, out_h, out_w]; a flat
// layer of F features has c = F and h = w = 1.
struct CnnLayer {
  CnnLayerOp op = CnnLayerOp::view;
  int in_c = 0, in_h = 1, in_w = 1;
  int out_c = 0, out_h = 1, out_w = 1;
  int kernel_h = 1, kernel_w = 1, stride = 1, padding = 0;  // conv2d; max_pool2d (square kernel, no padding)
  int weight = -1, bias = -1;                               // tensor indices (conv2d, linear)
  bool input_gradient = false;                              // the backward computes the input's gradient
  DropoutParams dropout;                                    // dropout, dropout2d
  Activation activation = Activation::relu;                 // activation (activation.cuh's math)
};

struct CnnStepArgs {
  int batch = 0;
  // The logits' gradient is (softmax - onehot) * gradient_scale / batch: 1,
  // or 1/ranks where a rank's gradients are pre-scaled (issue 38).
  float gradient_scale = 1.f;
  // The compute dtype: bf16 activations and weight casts, else fp16.
  bool bf16 = false;
  // SGD with Nesterov momentum (sgd_step.cuh's sgd_nesterov_step; every
  // tensor has a velocity), else plain momentum. Not read under an update rule.
  bool nesterov = false;
  int layers = 0;
  CnnLayer layer[kCnnStepMaxLayers];
  // Parameters: fp32 master tensors, their SGD velocities (null without
  // momentum, and under an update rule, whose state is CnnStepRuleState's)
  // and update scalars (the lr; SGD's momentum and weight decay); tensor t is elements
  // param_offset[t] to param_offset[t + 1] of the update kernel's range.
  int tensors = 0;
  float* param[kCnnStepMaxTensors] = {};
  float* velocity[kCnnStepMaxTensors] = {};
  const UpdateScalars* scalars[kCnnStepMaxTensors] = {};
  std::int64_t param_offset[kCnnStepMaxTensors + 1] = {};
  // Batch fetch: row perm[(step mod (rows/G))*G + rank*batch + i] of the u8
  // tables, G = ranks * batch (a data-parallel rank's slice of the global
  // batch; ranks = 1 otherwise), pixels scaled x*scale+shift (as launch_batch_fetch).
  const std::int32_t* perm = nullptr;
  std::int64_t rows = 0;
  int rank = 0, ranks = 1;
  std::int32_t* step = nullptr;  // advanced by one at the end of the step (not with gradients_out)
  // Data parallel (issue 38): kernel 2 stores tensor t's summed gradient,
  // rounded as the graph's value, as fp32 at gradient_out[t] instead of
  // updating; the update stage reduces it over the ranks, applies the
  // optimizer and advances the step (launch_cnn_step_gradients).
  bool gradients_out = false;
  float* gradient_out[kCnnStepMaxTensors] = {};
  const std::uint8_t* images = nullptr;
  const std::uint8_t* labels = nullptr;
  float scale = 1.f, shift = 0.f;
  float* loss = nullptr;  // mean cross-entropy of the batch
  // cnn_step_workspace_bytes of device memory: the blocks' gradient slices
  // (CnnStepLaunch::slice_floats each), the examples' linear-layer factors
  // (factor_floats each), one loss per example, then the step counter as
  // kernel 1 read it.
  float* workspace = nullptr;
  // The parameter image, cnn_step_image_bytes: the bytes of kernel 1's
  // shared memory from CnnStepLaunch::image_offset on (fp16 or bf16 weight layouts,
  // rounded biases, zeros in every padding).
  float* image = nullptr;
  // cnn_step_index_tables, copied in with the image's first part: they
  // depend on the layers' shapes only.
  const float* index_tables = nullptr;
  // Profiling only: when set, block 0 stores the GPU clock (ns) at the start
  // and after each phase of its first example, and the update kernel's block
  // 0 at its start and end; cnn_step_phase_names names the gaps.
  unsigned long long* phase_clock = nullptr;
};

constexpr std::uint8_t kReluAfter = 1, kReluRunByLayerBefore = 2;

// How kernel 1 runs: its grid and its shared-memory layout (in floats).
struct CnnStepLaunch {
  int blocks = 0;
  int threads = 0;
  std::size_t shared_bytes = 0;
  int act_offset[kCnnStepMaxLayers + 1] = {};  // [0]: the input image; [l+1]: layer l's output
  int grad_offset[2] = {};                     // two gradient buffers, used in turn
  // The parameter image, copied in once per block (kernel 1 changes no
  // parameter): conv2d / linear layer li's fp16 or bf16 weights at weight_offset[li],
  // a conv's data-gradient layout at weight_t_offset[li], its rounded bias at
  // bias_offset[li]; image_floats from image_offset on, in layer order, in
  // kImageParts parts: the first parameter layer's, the other conv layers',
  // the linear layers'. Part p + 1 starts part_start[p] floats into the image,
  // at layer part_layer[p]; a layer waits for its part's copies only when it
  // is reached, so the later parts arrive while the first layers run.
  int image_offset = 0, image_floats = 0;
  int part_start[2] = {}, part_layer[2] = {kCnnStepMaxLayers, kCnnStepMaxLayers};
  int weight_offset[kCnnStepMaxLayers] = {};
  int weight_t_offset[kCnnStepMaxLayers] = {};
  int bias_offset[kCnnStepMaxLayers] = {};
  // A conv layer's dY bordered with zeros (its data gradient) at
  // border_offset[li]; these zeroed_floats from zeroed_offset on are zeroed
  // once per block.
  int zeroed_offset = 0, zeroed_floats = 0;
  int border_offset[kCnnStepMaxLayers] = {};
  // A conv layer's GEMM index tables (int2 entries; cnn_step_index_tables):
  // its windows and taps (forward and weight gradient), and its data
  // gradient's rows and columns; tables_floats from tables_offset on.
  int tables_offset = 0, tables_floats = 0;
  int windows_offset[kCnnStepMaxLayers] = {};
  int taps_offset[kCnnStepMaxLayers] = {};
  int data_rows_offset[kCnnStepMaxLayers] = {};
  int data_columns_offset[kCnnStepMaxLayers] = {};
  int dy_offset = -1;                        // dY^T as fp16 or bf16 rows (-1: in the input gradient's buffer)
  // A ReLU right after a pooling or linear layer runs inside it: relu[li] is
  // kReluAfter for such a layer and kReluRunByLayerBefore for the ReLU.
  std::uint8_t relu[kCnnStepMaxLayers] = {};
  int mask_offset[kCnnStepMaxLayers] = {};  // a dropout layer's keep bits (bytes), from its forward to its backward
  int reduce_offset = 0;                     // the conv GEMMs' per-warp slots; a linear layer's gradient through its ReLU
  // The workspace: tensor t's gradient at slice_offset[t] of a block's slice;
  // with one example per block, the linear layers' tensors have none (-1):
  // linear layer li's dZ, then its input x, sit at factor_offset[li] of an
  // example's factor row (else -1).
  int slice_floats = 0, factor_floats = 0;
  int slice_offset[kCnnStepMaxTensors] = {};
  int factor_offset[kCnnStepMaxLayers] = {};
};

// Empty when the kernels run these sizes on this GPU; otherwise why not.
std::string cnn_step_unsupported(const CnnStepArgs& args);
// Shared memory a block of kernel 1 takes for these sizes, its copy of the
// arguments included (computed on the host: no GPU needed).
std::size_t cnn_step_shared_bytes(const CnnStepArgs& args);
// The shared-memory and workspace layout for these sizes when a block takes
// `examples_per_block` examples (no GPU needed; blocks left 0).
CnnStepLaunch cnn_step_layout(const CnnStepArgs& args, int examples_per_block);
// The launch for these sizes on the current GPU (call cnn_step_unsupported first).
CnnStepLaunch plan_cnn_step_launch(const CnnStepArgs& args);
std::size_t cnn_step_workspace_bytes(const CnnStepArgs& args, const CnnStepLaunch& launch);
std::size_t cnn_step_image_bytes(const CnnStepLaunch& launch);
// The conv GEMMs' index tables as kernel 1 reads them (the bytes of its
// shared memory from CnnStepLaunch::tables_offset on): which input element
// each row and column of a GEMM's A gathers (x: its offset; y: the window
// corner or tap, dy << 16 | dx, for the bounds check under padding; rows and
// columns past the GEMM's end have y = INT32_MIN and read zero).
std::vector<int2> cnn_step_index_tables(const CnnStepArgs& args, const CnnStepLaunch& launch);
// Rebuilds args.image from the fp32 parameters on `stream` (after the host
// wrote them; the step's update kernel keeps it current otherwise).
void launch_cnn_step_image(const CnnStepArgs& args, const CnnStepLaunch& launch, cudaStream_t stream);
// Names of the gaps between consecutive phase_clock entries.
std::vector<std::string> cnn_step_phase_names(const CnnStepArgs& args);
// Both kernels on `stream` (capturable), the update by SGD; args.workspace
// must be set. With `dependent` (BackendOptions::dependent_launch) the update
// kernel is a programmatic dependent of kernel 1 (ops/cuda/dependent_launch.cuh).
void launch_cnn_step(const CnnStepArgs& args, const CnnStepLaunch& launch, cudaStream_t stream, bool dependent);

// The state slots of every tensor's update rule (update_rule.hpp), by
// tensor index (CnnStepArgs::param); CnnStepArgs::velocity stays null.
struct CnnStepRuleState {
  StateSlots tensor[kCnnStepMaxTensors] = {};
};
// Both kernels, the update by `Rule` with `hyper` (instantiated for every
// rule: update_rules/all_rules.cuh). Its bias correction reads the step
// counter as it was at the step's start.
template <class Rule>
void launch_cnn_step(const CnnStepArgs& args, const CnnStepLaunch& launch, const CnnStepRuleState& state,
                     HyperOf<Rule> hyper, cudaStream_t stream, bool dependent);
// With args.gradients_out: the image rebuilt from the fp32 parameters (the
// update stage wrote them), kernel 1, then kernel 2 storing the gradients
// and the loss; the step counter is the update stage's to advance.
void launch_cnn_step_gradients(const CnnStepArgs& args, const CnnStepLaunch& launch, cudaStream_t stream,
                               bool dependent);

}  // namespace sg::cuda
