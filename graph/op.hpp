#pragma once
// The op set of the IR and each node's typed attributes. Everything else an op
// is (dump name, shape rule, gradient rule, in-place slots, CPU reference)
// lives in its registry entry: graph/op_registry.hpp, one file per op (or
// small family) under graph/ops/.
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "graph/dtype.hpp"
#include "graph/value.hpp"

namespace sg {

struct GraphError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class OpKind : std::uint8_t {
  batch_indices,          // (perm i32[N], step i32[1]) -> idx i32[B]
  gather_rows,            // (table [N,D] or [N], idx i32[B]) -> [B,D] or [B]
  matmul,                 // (A, B) -> op(A) op(B)
  bias_add,               // (X [M,N], b [N]) -> X + b
  relu,                   // X -> max(X, 0)
  relu_backward,          // (dY, Y) -> dY * (Y > 0)
  softmax_xent,           // (logits [B,C], labels i32[B]) -> mean loss f32[1]
  softmax_xent_backward,  // (logits, labels) -> (softmax - onehot) / B
  reduce_rows,            // X [M,N] -> column sums [N]
  add,                    // (X, Y) -> X + Y   (gradient accumulation)
  cast,                   // X -> X in CastAttrs::out_dtype
  sgd_update,             // (param, grad[, velocity]) -> nothing; updates in place
  advance_step,           // step i32[1] -> nothing; step += 1 in place
  count_correct,          // (logits [B,C], labels i32[B]) -> i32[1] argmax hits
  gelu,                   // X -> X * Phi(X) (exact, erf-based)
  gelu_backward,          // (dY, X) -> dY * gelu'(X)
  bias_add_relu,          // (X [M,N], b [N]) -> (Z = X + b, relu(Z)): two outputs
  // ---- activations, regression losses, label smoothing, dropout (issue 21)
  gelu_tanh,              // X -> 0.5 X (1 + tanh(sqrt(2/pi) (X + 0.044715 X^3)))
  gelu_tanh_backward,     // (dY, X) -> dY * gelu_tanh'(X)
  silu,                   // X -> X * sigmoid(X)
  silu_backward,          // (dY, X) -> dY * silu'(X)
  tanh,                   // X -> tanh(X)
  tanh_backward,          // (dY, Y) -> dY * (1 - Y^2)
  sigmoid,                // X -> 1 / (1 + exp(-X))
  sigmoid_backward,       // (dY, Y) -> dY * Y * (1 - Y)
  mse_loss,               // (pred [B,K], target [B,K]) -> mean (pred - target)^2 f32[1]
  mse_loss_backward,      // (pred, target) -> 2 (pred - target) / (B K)
  l1_loss,                // (pred [B,K], target [B,K]) -> mean |pred - target| f32[1]
  l1_loss_backward,       // (pred, target) -> sign(pred - target) / (B K)
  softmax_xent_smoothed,           // (logits, labels) -> label-smoothed mean cross-entropy f32[1]
  softmax_xent_smoothed_backward,  // (logits, labels) -> (softmax - smoothed target) / B
  dropout,                // (X, step i32[1]) -> X * keep / (1 - p), keep from Philox(seed, step, element)
  dropout_backward,       // (dY, step i32[1]) -> dY * keep / (1 - p), the same mask recomputed
  // ---- optimizers and gradient clipping (issue 21)
  adam_update,            // (param, grad, m, v, step i32[1][, clip scale f32[1]]) -> nothing; Adam/AdamW in place
  grad_clip_scale,        // (grad, grad, ...) -> f32[1] min(1, max_norm / (global L2 norm + 1e-6))
  scale_grad,             // (grad, scale f32[1]) -> grad * scale
  // ---- convolutional networks (issue 22); NCHW, or [N,H,W,C] with channels_last (Conv2dAttrs, Pool2dAttrs)
  conv2d,                 // (X [N,C,H,W], W [O,C,KH,KW][, b [O]]) -> Y [N,O,H',W']
  conv2d_backward_data,   // (dY [N,O,H',W'], W) -> dX [N,C,H,W]
  conv2d_backward_filter, // (dY [N,O,H',W'], X) -> dW [O,C,KH,KW]
  channel_sum,            // X [N,C,H,W] -> [C] sums over N, H, W (conv bias gradients)
  max_pool2d,             // X [N,C,H,W] -> [N,C,H',W'] window maxima (no padding, floor)
  max_pool2d_backward,    // (dY, X) -> dX: dY routed to the first maximum of each window
  flatten,                // X [N, ...] -> [N, prod(...)]
  reshape,                // X -> the same elements in ReshapeAttrs::shape (flatten's gradient)
  dropout2d,              // (X [N,C,H,W], step i32[1]) -> whole channels dropped, Philox(seed, step, n*C+c)
  dropout2d_backward,     // (dY, step i32[1]) -> dY times the forward's channel mask recomputed
  // ---- data-parallel training (issue 25)
  all_reduce_mean,        // (grad, ...) -> (mean of each over the data-parallel ranks, ...): one bucket
  // ---- update rules added on the update stage (issue 35)
  rmsprop_update,         // (param, grad, square_avg[, momentum_buf][, grad_avg][, clip scale f32[1]]) -> nothing
  // ---- pooling beyond max (issue 37)
  avg_pool2d,             // X [N,C,H,W] -> [N,C,H',W'] window means (no padding, floor)
  avg_pool2d_backward,    // dY [N,C,H',W'] -> dX [N,C,grad_h,grad_w]: dY / k^2 spread over each window
  global_avg_pool2d,      // X [N,C,H,W] -> [N,C,1,1] plane means (PyTorch's AdaptiveAvgPool2d(1))
  global_avg_pool2d_backward,  // dY [N,C,1,1] -> dX [N,C,H,W] (ReshapeAttrs::shape): dY / (H W) everywhere
  // ---- normalisation (issue 37)
  layer_norm,             // (X [N,...], gamma [...], beta [...]) -> (X - mean) / sqrt(var + eps) * gamma + beta per example
  layer_norm_backward,    // (dY, X, gamma) -> (dX, dgamma, dbeta): the statistics recomputed from X
  // ---- merging branches (issue 37)
  concat,                 // (X0 [N,C0,...], X1 [N,C1,...], ...) -> [N, C0+C1+..., ...]: joined along dimension 1
  slice_channels,         // X [N,C,...] -> [N,count,...]: channels begin..begin+count (concat's gradient)
  // ---- training-batch augmentation (issue 37)
  augment_images,         // (X [N,C,H,W], step i32[1]) -> X flipped / translated per example, Philox(seed, step, example)
  // ---- batch normalisation (issue 37); X [N,C] or [N,C,H,W], per-channel statistics over N (and H, W)
  batch_norm,             // (X, gamma [C], beta [C]) -> X normalised by the batch's statistics, scaled, shifted
  batch_norm_backward,    // (dY, X, gamma) -> (dX, dgamma, dbeta): the batch statistics recomputed from X
  batch_norm_stats_update,  // (X, running_mean [C], running_var [C]) -> nothing; the running statistics in place
  batch_norm_inference,   // (X, gamma, beta, running_mean, running_var) -> X normalised by the running statistics
  // ---- activation layouts (issues 36, 37): graph/channels_last_pass.hpp
  to_channels_last,       // X [N,C,H,W] -> [N,H,W,C]
  to_channels_first,      // X [N,H,W,C] -> [N,C,H,W]
  // ---- sharded updates, ZeRO-1 (issue 38): graph/optimizer_pass.hpp
  all_gather_shards,      // (param) -> the parameter with every rank's shard (AllReduceAttrs::shards) gathered
  // ---- weight gradients from every rank's rows (issue 38): graph/gathered_gradients.hpp
  all_gather_batch,       // X [N,...] -> [shards*N,...]: every rank's rows, rank r's at rows r*N (AllReduceAttrs::shards ranks)
};

std::string_view op_name(OpKind op);
OpKind op_from_name(std::string_view name);  // throws std::invalid_argument
// Ops with no outputs that write some of their inputs in place.
bool op_updates_in_place(OpKind op);

// ---- typed attributes: one record per attribute kind, each op takes one kind
struct NoAttrs {
  bool operator==(const NoAttrs&) const = default;
};
struct BatchIndicesAttrs {
  std::int64_t batch = 0;
  // Data parallel (issue 25): each of `ranks` ranks takes `batch` rows at
  // offset rank * batch of every global batch of ranks * batch rows.
  std::int64_t rank = 0;
  std::int64_t ranks = 1;
  bool operator==(const BatchIndicesAttrs&) const = default;
};
struct GatherRowsAttrs {  // out = in * scale + shift
  DType out_dtype = DType::f32;
  double scale = 1.0;
  double shift = 0.0;
  bool operator==(const GatherRowsAttrs&) const = default;
};
struct MatmulAttrs {
  bool trans_a = false;
  bool trans_b = false;
  bool operator==(const MatmulAttrs&) const = default;
};
struct CastAttrs {
  DType out_dtype = DType::f32;
  bool operator==(const CastAttrs&) const = default;
};
// The learning rate is run state of the optimizer (an executor scalar, a
// device scalar table), not an attribute of the IR.
struct SgdUpdateAttrs {
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // PyTorch's SGD(nesterov=True): needs momentum > 0
  bool operator==(const SgdUpdateAttrs&) const = default;
};

// PyTorch CrossEntropyLoss(label_smoothing=eps): the target is
// (1 - eps) * onehot + eps / classes.
// gradient_scale: as LossGradientAttrs::scale, on the backward op only.
struct LabelSmoothingAttrs {
  double eps = 0.0;
  double gradient_scale = 1.0;
  bool operator==(const LabelSmoothingAttrs&) const = default;
};
// A loss's backward op: the gradient of the mean loss times `scale`. A
// data-parallel rank of N (issue 38) scales by 1/N: its gradient is then its
// share of the global batch's mean, and the ranks' sum is the mean
// (AllReduceAttrs::pre_scaled), with no division after the reduction.
struct LossGradientAttrs {
  double scale = 1.0;
  bool operator==(const LossGradientAttrs&) const = default;
};
// all_reduce_mean: pre_scaled, each rank's inputs are already divided by the
// number of ranks (the loss gradient's scale above), so the mean is their sum.
// shards > 1 (ZeRO-1, issue 38; all_reduce_mean and all_gather_shards): each
// tensor is cut into `shards` equal ranges of its flattened elements, rank r
// owning range r. An all_reduce_mean then reduces-scatters: only this rank's
// range of each output holds the mean (the rest is unspecified), and the
// updates that read it update that range alone; all_gather_shards fills every
// range from the rank that owns it. The CPU reference is a group of one.
// all_gather_batch (issue 38, graph/gathered_gradients.hpp): `shards` is the
// number of ranks whose rows it gathers.
struct AllReduceAttrs {
  bool pre_scaled = false;
  std::int64_t shards = 0;
  bool operator==(const AllReduceAttrs&) const = default;
};
// Inverted dropout (PyTorch's): an element is kept with probability 1 - p and
// scaled by 1 / (1 - p). The keep bit of element i at step s is drawn from
// Philox4x32-10 keyed by `seed` with a counter made of i / 4, stream and s
// (ops/philox.hpp); `stream` tells the dropout sites of one graph apart.
// channels_last (dropout2d only): the value is [N,H,W,C]; channel (n, c)
// draws the same bit as in [N,C,H,W], so both layouts drop the same channels.
struct DropoutAttrs {
  double p = 0.0;
  std::uint64_t seed = 0;
  std::int64_t stream = 0;
  bool channels_last = false;
  bool operator==(const DropoutAttrs&) const = default;
};

// PyTorch's Adam (decoupled = false: weight decay added to the gradient) and
// AdamW (decoupled = true: w *= 1 - lr*wd before the step). Bias correction
// uses t = step + 1 read from the graph's step counter; lr is run state.
struct AdamUpdateAttrs {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;
  bool operator==(const AdamUpdateAttrs&) const = default;
};
// PyTorch's RMSprop(alpha, eps, weight_decay, momentum, centered): weight
// decay added to the gradient; square_avg (and grad_avg when centered,
// momentum_buf when momentum > 0) are f32 state; lr is run state.
struct RmspropUpdateAttrs {
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
  bool operator==(const RmspropUpdateAttrs&) const = default;
};
// torch.nn.utils.clip_grad_norm_(max_norm): the scale every update applies.
struct ClipGradAttrs {
  double max_norm = 1.0;
  bool operator==(const ClipGradAttrs&) const = default;
};

// 2-D convolution over NCHW values: NCHW is cuDNN's default (fully packed)
// layout and PyTorch's, so the later cuDNN lowering maps these values with
// no transposes and PyTorch parity needs no weight permutation. stride and
// padding apply to H and W alike; padding is zeros. On the backward ops,
// grad_h x grad_w is the spatial size of the gradient they produce (dX's H x W
// for conv2d_backward_data, the kernel's KH x KW for conv2d_backward_filter):
// the floor in the output size leaves it ambiguous from dY alone. 0 on conv2d.
// channels_last: the activations (X, Y, dX, dY) are [N,H,W,C] instead, the
// layout cuDNN's fastest engines read (graph/channels_last_pass.hpp writes
// it); the weights stay [O,C,KH,KW], so parameters do not depend on it.
// filter_channels_last: the filter W (or dW) is [O,KH,KW,C] instead, the
// layout cuDNN's channels-last engines read without a transpose of their own
// (graph/filter_layout_pass.hpp gives convolutions a copy in it).
struct Conv2dAttrs {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t grad_h = 0;
  std::int64_t grad_w = 0;
  bool channels_last = false;
  bool filter_channels_last = false;
  bool operator==(const Conv2dAttrs&) const = default;
};
// Square window pooling with no padding (output size floored), as
// PyTorch's MaxPool2d(kernel, stride) and AvgPool2d(kernel, stride). On
// avg_pool2d_backward, grad_h x grad_w is dX's spatial size (the floor leaves
// it ambiguous from dY, as for the conv gradients); 0 on the other ops.
// (max_pool2d_backward takes X itself, which decides its argmax.)
// channels_last (max_pool2d and its backward only): X and Y are [N,H,W,C].
struct Pool2dAttrs {
  std::int64_t kernel = 2;
  std::int64_t stride = 2;
  std::int64_t grad_h = 0;
  std::int64_t grad_w = 0;
  bool channels_last = false;
  bool operator==(const Pool2dAttrs&) const = default;
};
// The output shape of a reshape (same element count as the input), and of
// global_avg_pool2d_backward (the pooled input's shape, which dY's [N,C,1,1]
// does not tell).
struct ReshapeAttrs {
  Shape shape;
  bool operator==(const ReshapeAttrs&) const = default;
};

// PyTorch's LayerNorm(normalized_shape = every dimension but the first,
// eps): the biased variance of each example's values.
struct LayerNormAttrs {
  double eps = 1e-5;
  bool operator==(const LayerNormAttrs&) const = default;
};

// A block of channels (dimension 1): slice_channels' [begin, begin + count).
struct SliceAttrs {
  std::int64_t begin = 0;
  std::int64_t count = 1;
  bool operator==(const SliceAttrs&) const = default;
};

// Random translation and horizontal flip of each training image: example i
// of the batch (global index example_offset + i: data-parallel ranks draw
// as one process with their global batch) at step s is moved by (dy, dx),
// each in [-translate, translate], and mirrored first when `flip` and its
// draw say so; pixels moved in from outside the image are `fill` (the value
// a raw 0 has after the input scaling). Draws: ops/cpu/augment_reference.hpp.
struct AugmentAttrs {
  std::int64_t translate = 0;
  bool flip = false;
  double fill = 0.0;
  std::uint64_t seed = 0;
  std::int64_t example_offset = 0;
  bool operator==(const AugmentAttrs&) const = default;
};

// PyTorch's BatchNorm1d/2d(eps, momentum): running = (1 - momentum) running
// + momentum * batch statistic (the variance unbiased there, biased in the
// normalisation). channels_last: X is [N,H,W,C] (graph/channels_last_pass.hpp
// writes it): the channels are the last dimension and each channel's
// statistics run over the N*H*W rows of the [N*H*W, C] matrix, BatchNorm1d's
// layout; the per-channel values stay [C].
struct BatchNormAttrs {
  double eps = 1e-5;
  double momentum = 0.1;
  bool channels_last = false;
  bool operator==(const BatchNormAttrs&) const = default;
};
// X (`shape`, rank >= 2) as (n, channels, plane), the CPU reference's and the
// kernels' view: [N, C, ...] as N examples of C planes of the rest;
// channels_last [N, H, W, C] as the [N*H*W, C] matrix (plane 1).
struct BatchNormLayout {
  std::int64_t n, channels, plane;
};
BatchNormLayout batch_norm_layout(std::span<const std::int64_t> shape, const BatchNormAttrs& attrs);

using OpAttrs = std::variant<NoAttrs, BatchIndicesAttrs, GatherRowsAttrs, MatmulAttrs, CastAttrs, SgdUpdateAttrs,
                             LabelSmoothingAttrs, DropoutAttrs, AdamUpdateAttrs, ClipGradAttrs, Conv2dAttrs,
                             Pool2dAttrs, ReshapeAttrs, RmspropUpdateAttrs, LayerNormAttrs, SliceAttrs, AugmentAttrs,
                             BatchNormAttrs, LossGradientAttrs, AllReduceAttrs>;

// Position of A in OpAttrs.
template <typename A, std::size_t I = 0>
constexpr std::size_t attrs_index() {
  static_assert(I < std::variant_size_v<OpAttrs>, "not an OpAttrs alternative");
  if constexpr (std::is_same_v<A, std::variant_alternative_t<I, OpAttrs>>) return I;
  else return attrs_index<A, I + 1>();
}
// "none", "batch_indices", "gather_rows", "matmul", "cast", "sgd_update",
// "label_smoothing", "dropout", "adam_update", "clip_grad", "conv2d", "pool2d",
// "reshape", "rmsprop_update", "layer_norm", "slice", "augment", "batch_norm",
// "loss_gradient", "all_reduce".
std::string_view attrs_kind_name(std::size_t index);
inline std::string_view attrs_kind_name(const OpAttrs& attrs) { return attrs_kind_name(attrs.index()); }

// Patterns the fusion pass recognises; a backend lowers each group to one
// kernel (or one cuBLASLt call plus at most one element-wise kernel).
enum class FusionKind : std::uint8_t {
  batch_fetch,     // batch_indices + gather_rows...
  linear_forward,  // matmul + bias_add [+ relu | gelu_tanh]
  dgrad_drelu,     // matmul producing dY + relu_backward
  wgrad_sgd,       // matmul producing a weight gradient [+ cast] + sgd_update
  bgrad_sgd,       // reduce_rows producing a bias gradient [+ cast] + sgd_update
  xent_fused,      // softmax_xent + softmax_xent_backward
  dgrad_dgelu,     // matmul producing dY + gelu_tanh_backward reading a fused forward's pre-activation
};

std::string_view fusion_name(FusionKind kind);
FusionKind fusion_from_name(std::string_view name);  // throws std::invalid_argument

struct Node {
  NodeId id = -1;
  OpKind op = OpKind::add;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  OpAttrs attrs;
  int fusion_group = -1;  // index into Graph::fusion_groups(), -1 when alone

  // The attributes as A; throws GraphError("node N (op): attributes are not
  // <kind>") when they are of another kind.
  template <typename A>
  const A& attr() const;

  bool operator==(const Node&) const = default;
};

// Input slots an in-place node writes (sgd_update: param and velocity). The
// attributes take part: which optional inputs a node has can depend on them
// (rmsprop_update's momentum_buf and grad_avg, before an optional clip scale).
std::vector<int> in_place_inputs(const Node& node);

[[noreturn]] void throw_wrong_attrs(const Node& node, std::size_t wanted_index);

template <typename A>
const A& Node::attr() const {
  if (const A* a = std::get_if<A>(&attrs)) return *a;
  throw_wrong_attrs(*this, attrs_index<A>());
}

struct FusionGroup {
  int id = -1;
  FusionKind kind = FusionKind::linear_forward;
  std::vector<NodeId> nodes;  // in graph order

  bool operator==(const FusionGroup&) const = default;
};

}  // namespace sg
