#pragma once
// Appends the optimizer: one update per parameter. sgd_update is placed as
// early as it is legal (after its gradient is produced and after the last read
// of the parameter) so gradients die young (and fuse with their matmul);
// adam_update and rmsprop_update after the last gradient, so a backend can run
// all of them in one multi-tensor launch (a bias's update still fuses with its
// column sum).
// With gradient clipping, one grad_clip_scale node reads every gradient and
// each update reads its scale (Adam directly, SGD through a scale_grad node).
// The step advance is the pipeline's (graph/training_graph.hpp); Adam reads
// the step counter it is given for its bias correction.
#include <cstdint>
#include <optional>
#include <string_view>

#include "graph/autodiff.hpp"
#include "graph/gathered_gradients.hpp"

namespace sg {

enum class OptimizerKind : std::uint8_t { sgd, adam, adamw, rmsprop };

std::string_view optimizer_name(OptimizerKind kind);            // "sgd", "adam", "adamw", "rmsprop"
OptimizerKind optimizer_from_name(std::string_view name);       // throws std::invalid_argument

struct OptimizerSpec {
  // The initial learning rate, for trainers (CpuExecutor::set_learning_rate,
  // the CUDA program's scalar table): the graph does not hold it.
  double lr = 0.01;
  double momentum = 0.0;      // sgd: > 0 adds a velocity state per parameter ("vel_<param>"); rmsprop: "rms_buf_<param>"
  double weight_decay = 0.0;  // sgd, adam, rmsprop: added to the gradient; adamw: decoupled
  OptimizerKind kind = OptimizerKind::sgd;
  bool nesterov = false;      // sgd: needs momentum > 0
  double beta1 = 0.9;         // adam, adamw: state "adam_m_<param>", "adam_v_<param>" (f32)
  double beta2 = 0.999;
  double eps = 1e-8;           // adam, adamw, rmsprop
  double alpha = 0.99;         // rmsprop: smoothing of square_avg ("rms_sq_<param>", f32)
  bool centered = false;       // rmsprop: also a grad_avg state ("rms_avg_<param>"); momentum > 0: "rms_buf_<param>"
  double clip_grad_norm = 0.0;  // > 0: scale every gradient by min(1, c / (global L2 norm + 1e-6))
  // Data parallel (issue 25): every gradient passes through an all_reduce_mean
  // bucket (one per layer: the gradients computed from the same upstream
  // gradient) right after the last of its gradients is produced; clipping and
  // the updates read the reduced gradients.
  bool all_reduce_gradients = false;
  // With all_reduce_gradients, where fp32 master weights' gradients are
  // reduced: false, in f32 (after their widening casts); true, in the compute
  // dtype (f16/bf16, before the casts, which move to the end of the backward
  // pass: half the bytes on the wire, the mean rounded to the compute dtype
  // once more). No effect on f16/bf16 weights: theirs are reduced as they are.
  bool reduce_in_compute_dtype = false;
  // With all_reduce_gradients: 0, one bucket per layer; > 0, the layers'
  // buckets joined in the order their gradients complete until one holds at
  // least this many bytes (PyTorch DDP's bucket_cap_mb), each joined bucket
  // one all_reduce_mean right after its last gradient.
  std::int64_t bucket_bytes = 0;
  // With all_reduce_gradients, the number of ranks when > 1: every loss
  // backward's gradient is scaled by 1/ranks (LossGradientAttrs), so each
  // rank's gradients are its share of the global batch's mean, and each
  // bucket sums them (AllReduceAttrs::pre_scaled): the same mean without a
  // division after the reduction, and for two ranks the correctly rounded
  // one. 0 or 1: the buckets average (one rank: a copy).
  std::int64_t pre_scale_ranks = 0;
  // ZeRO-1 (issue 38), with pre_scale_ranks = N > 1: each parameter of at
  // least shard_min_bytes whose elements divide into N ranges of a multiple
  // of kShardAlignment is sharded. Its bucket reduces-scatters it
  // (AllReduceAttrs::shards = N), its update rule runs on this rank's range
  // alone (a backend reads the rank from its process group), and an
  // all_gather_shards node at the step's start, before the forward's first
  // read, fills the other ranges from their owners for every reader but the
  // update (of the f16/bf16 copy, with fp32 master weights). The parameters
  // and optimizer state between steps are then current in this rank's range
  // only: a backend gathers them before anything else reads them (eval,
  // checkpoints). Smaller parameters are all-reduced as before. Not with
  // clip_grad_norm (the norm would need every shard): GraphError.
  bool shard_updates = false;
  // Smaller parameters stay all-reduced: a reduce-scatter and an all-gather
  // of their own (~7 us of NCCL latency each) cost more than half an update
  // saves below ~10M parameters (SGD with momentum: ~10 bytes a parameter
  // at ~3.5 TB/s). 16 MiB, data_parallel.zero1_min_mb's default; tests
  // shard smaller ones.
  std::int64_t shard_min_bytes = std::int64_t{16} << 20;
  // With pre_scale_ranks = R > 1: which layers' gradients come from every
  // rank's rows instead of an all-reduce (graph/gathered_gradients.hpp). Their
  // updates read them directly and are placed as in a single process; they
  // are neither bucketed nor sharded.
  WeightGradients weight_gradients = WeightGradients::by_bytes;
};

// Each rank's range of a sharded parameter is a multiple of this many
// elements (vector-aligned for the update kernels at any element size).
inline constexpr std::int64_t kShardAlignment = 64;

// `step` is the graph's step counter (i32 [1] state, advanced after the
// updates); Adam needs it, SGD ignores it. Throws GraphError when the spec is
// unusable (nesterov without momentum, Adam without a step counter).
void append_optimizer(Graph& graph, const GradientMap& grads, const OptimizerSpec& spec,
                      std::optional<ValueId> step = std::nullopt);

// Whether `op` is one of the update rules this pass appends (sgd_update,
// adam_update, rmsprop_update): a node that updates a parameter in place.
bool is_update_rule(OpKind op);

}  // namespace sg
