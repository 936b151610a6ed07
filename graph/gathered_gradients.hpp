#pragma once
// Weight gradients from every rank's rows (issue 38, data parallel): instead
// of each rank computing its rows' gradient of a layer and the ranks
// all-reducing it, each rank gathers the layer's inputs over the batch (the
// activation X and the upstream gradient dY, `all_gather_batch`) and computes
// the whole batch's gradient itself: dW = X_all^T dY_all, db = colsum(dY_all),
// a convolution's filter gradient over every rank's examples. With the loss
// gradient pre-scaled by 1/R (OptimizerSpec::pre_scale_ranks) that is the
// mean over the global batch, the all-reduce's result, on every rank.
//
// Why: an all-reduce moves about 2 (R-1)/R times a gradient's bytes per rank
// and can start only when the gradient is done; the gathers move times
// the layer's rows, X's while the forward runs, dY's beside the layers below.
// For a wide layer at a small per-GPU batch the rows are far fewer bytes
// (784-8192x3-10 at batch 256, 2 ranks: 8 MB a hidden layer against 134 MB),
// and the update reads a gradient produced on the rank, so the fused
// gradient-and-update lowerings of a single process stay. The price is the
// weight gradients' arithmetic: R times the rows.
//
// A layer qualifies when each of its gradients (the gradients computed from
// one upstream gradient, as the all-reduce buckets group them, looking
// through fp32 master weights' casts and filter layouts) is a sum over the batch of its inputs'
// rows: matmul(A^T B) of two batch-major values, reduce_rows, channel_sum or
// conv2d_backward_filter.
#include <cstdint>
#include <set>
#include <string_view>

#include "graph/autodiff.hpp"

namespace sg {

// data_parallel.weight_gradients: every gradient all-reduced ("reduce"), every
// layer that qualifies gathered ("gather"), or a layer gathered where that
// costs less than its all-reduce ("auto": gathering_pays).
enum class WeightGradients : std::uint8_t { reduce, gather, by_bytes };

std::string_view weight_gradients_name(WeightGradients mode);        // "reduce", "gather", "auto"
WeightGradients weight_gradients_from_name(std::string_view name);   // throws std::invalid_argument

// Bytes a rank receives for one layer, each way (for `ranks` ranks).
struct LayerTraffic {
  std::int64_t gathered = 0;  // (R - 1) x the rows of the values the layer's gradients read
  std::int64_t gathers = 0;   // how many values that is: one collective each
  std::int64_t reduced = 0;   // 2 (R - 1) / R x the gradients' bytes (in a joined bucket: no call of its own)
};

// What one collective call costs beyond its bytes, as bytes: NCCL's ~7 us a
// call at ~280 GB/s in a captured graph on 2 H200s (docs/data_parallel.md).
// Without it "auto" gathered the 1024-wide MLP's layers (1 MB of rows against
// 2.1 MB of gradient) and lost 20% (eight calls in turn on the communication
// stream against one joined bucket).
inline constexpr std::int64_t kCollectiveCallBytes = std::int64_t{2} << 20;

// "auto": whether a layer's gathers (their bytes and calls) cost less than its all-reduce.
bool gathering_pays(const LayerTraffic& traffic);

// Inserts one all_gather_batch per value the chosen layers' gradients read
// (right after that value is produced) and makes those gradient nodes read
// the gathered values. Returns the parameters whose gradients are now the
// global batch's: their updates read them directly; the rest are to be
// all-reduced. Nothing for `ranks` < 2 or WeightGradients::reduce.
std::set<ValueId> gather_rows_for_gradients(Graph& graph, const GradientMap& grads, std::int64_t ranks,
                                            WeightGradients mode);

// The node that computes `grad` (looking through casts of fp32 master
// weights and the to_channels_first that turns a channels-last filter's
// gradient back into its parameter's layout, graph/filter_layout_pass.hpp),
// and the layer it belongs to: the upstream gradient it reads (dW and db
// share dY), or the gradient itself when it reads none. (Before that
// look-through a channels-last convolution's weight and bias went to two
// all-reduce buckets: 5 NCCL launches for a 3-layer CNN rank on a GPU.)
NodeId gradient_producer(const Graph& graph, ValueId grad);
ValueId gradient_layer(const Graph& graph, ValueId grad);

}  // namespace sg
