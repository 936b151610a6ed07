#include "runtime/backend_option_table.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sg {
namespace {

// Row builders: a field of BackendOptions seen as a switch, a count or a name.
#define SG_BOOL_ROW(field, owner, doc)                                                              \
  BackendOptionRow {                                                                                \
    #field, owner, doc, {}, [](const BackendOptions& o) { return BackendOptionValue(o.field); },     \
        [](BackendOptions& o, const BackendOptionValue& v) { o.field = std::get<bool>(v); }, nullptr \
  }
#define SG_INT_ROW(field, owner, doc, check)                                                               \
  BackendOptionRow {                                                                                       \
    #field, owner, doc, {}, [](const BackendOptions& o) { return BackendOptionValue(std::int64_t(o.field)); }, \
        [](BackendOptions& o, const BackendOptionValue& v) {                                               \
          o.field = static_cast<decltype(o.field)>(std::get<std::int64_t>(v));                             \
        },                                                                                                 \
        check                                                                                              \
  }

std::string at_least_one(const BackendOptionValue& v) {
  return std::get<std::int64_t>(v) >= 1 ? "" : "must be >= 1";
}
std::string strip_splits_check(const BackendOptionValue& v) { return strip_splits_problem(std::get<std::int64_t>(v)); }
std::string resident_cluster_check(const BackendOptionValue& v) {
  return resident_cluster_problem(std::get<std::int64_t>(v));
}

std::string zero_to_512(const BackendOptionValue& v) {
  const std::int64_t n = std::get<std::int64_t>(v);
  return n >= 0 && n <= 512 ? "" : "must be 0-512";
}

std::string auto_one_or_two(const BackendOptionValue& v) {
  const std::int64_t n = std::get<std::int64_t>(v);
  return n >= 0 && n <= 2 ? "" : "must be 0 (auto: 2, a data-parallel rank 1), 1 or 2";
}

std::vector<BackendOptionRow> make_table() {
  std::vector<BackendOptionRow> t;
  // --- core: every graph, with or without fast paths
  t.push_back(SG_BOOL_ROW(autotune, "core", "time cuBLASLt's (and cuDNN's) candidates once per shape"));
  t.push_back(SG_BOOL_ROW(cublaslt_split_k, "core",
                          "with autotune: a long reduction into few outputs (a linear layer after a CNN's flatten) is "
                          "timed at any size, the heuristic's algorithms split 2-16 ways among the candidates"));
  t.push_back(SG_INT_ROW(cudnn_knob_variants, "core",
                         "with autotune: up to this many more cuDNN candidates, the three fastest engines with one "
                         "knob (split-K, tiles, stages) moved from its default",
                         zero_to_512));
  t.push_back(SG_INT_ROW(steps_per_launch, "core", "training steps captured per CUDA graph launch", at_least_one));
  t.push_back(SG_BOOL_ROW(core_only, "core",
                          "no fast path at all: the core lowerings alone (cuBLASLt, cuDNN, the plain kernels)"));
  t.push_back(SG_BOOL_ROW(dependent_launch, "core", "programmatic dependent launch (Hopper) in our kernels"));
  t.push_back(SG_BOOL_ROW(weight_gradient_stream, "core",
                          "weight gradients and updates on a second stream beside the data-gradient chain (a "
                          "data-parallel rank too: its all-reduces wait for the gradients they read)"));
  t.push_back(SG_INT_ROW(gradient_streams, "core",
                         "streams the weight gradients and updates spread over (0: auto, 2 in a single process and "
                         "1 in a data-parallel rank; 1 or 2 everywhere; with 2, those forked at one place that do "
                         "not depend on one another run side by side: a weight gradient and its bias's column sums)",
                         auto_one_or_two));
  t.push_back(SG_BOOL_ROW(independent_launch_stream, "core",
                          "launches that depend on no earlier launch of the step (the parameter casts) run on the "
                          "second stream from the step's start, beside the batch fetch, and so do those computed "
                          "from the parameters alone (the filters' channels-last copies)"));
  t.push_back(SG_BOOL_ROW(communication_stream, "core",
                          "data parallel: each bucket's all-reduce on its own stream, overlapping the backward (off: "
                          "on the step's stream, in schedule order)"));
  t.push_back(SG_BOOL_ROW(update_per_bucket, "core",
                          "data parallel: one update launch per all-reduce bucket, each after its own bucket, "
                          "beside the later buckets' all-reduces (default; off: one update launch after the last "
                          "bucket)"));
  t.push_back(SG_BOOL_ROW(large_updates_apart, "core",
                          "an update-rule update of 32 MB or more whose gradient is ready before the last "
                          "one runs in a launch of its own beside the rest of the backward (off: all after the last "
                          "gradient)"));
  t.push_back(SG_BOOL_ROW(gradient_stream_first, "core",
                          "the gradient stream's kernels are scheduled before the step stream's (off: the same "
                          "priority)"));
  t.push_back(BackendOptionRow{
      "conv_kernels", "core",
      "who runs the convolutions: auto (ours where measured faster, cuDNN elsewhere) | cudnn | implicit_gemm (ours) | "
      "tensor_core (our channels-last tensor-core kernels where they take the shape; with autotune where timed faster "
      "than cuDNN)",
      {"auto", "cudnn", "implicit_gemm", "tensor_core"},
      [](const BackendOptions& o) { return BackendOptionValue(std::string(conv_kernels_name(o.conv_kernels))); },
      [](BackendOptions& o, const BackendOptionValue& v) { o.conv_kernels = conv_kernels_from_name(std::get<std::string>(v)); },
      nullptr});
  t.push_back(BackendOptionRow{
      "activation_layout", "core",
      "convolution layers' activations: auto (with autotune: both forms timed at start-up, the faster kept; "
      "without: channels-last where the regions end at a flatten, by the host rule) | nchw | channels_last",
      {"auto", "nchw", "channels_last"},
      [](const BackendOptions& o) { return BackendOptionValue(std::string(activation_layout_name(o.activation_layout))); },
      [](BackendOptions& o, const BackendOptionValue& v) {
        o.activation_layout = activation_layout_from_name(std::get<std::string>(v));
      },
      nullptr});
  // --- fast path whole_step
  t.push_back(SG_BOOL_ROW(whole_step, "whole_step", "one kernel (a small CNN: two) per step where the model fits it"));
  t.push_back(BackendOptionRow{
      "whole_step_mode", "whole_step",
      "whole-step variant: auto (where it measured faster) | grid | cluster | resident (wherever it fits)",
      {"auto", "grid", "cluster", "resident"},
      [](const BackendOptions& o) { return BackendOptionValue(std::string(whole_step_mode_name(o.whole_step_mode))); },
      [](BackendOptions& o, const BackendOptionValue& v) {
        o.whole_step_mode = whole_step_mode_from_name(std::get<std::string>(v));
      },
      nullptr});
  t.push_back(SG_INT_ROW(resident_cluster, "whole_step",
                         "resident whole-step kernel: cluster size (0: the largest that fits)", resident_cluster_check));
  // --- fast path one_pass_backward
  t.push_back(SG_BOOL_ROW(one_pass_backward, "one_pass_backward",
                          "a layer's dgrad + update in one pass over W, the output layer's backward in one kernel "
                          "(off: cuBLASLt's two passes and a gradient buffer)"));
  t.push_back(SG_BOOL_ROW(fold_input_update, "one_pass_backward",
                          "the first layer's update inside the one-pass launch above it"));
  t.push_back(SG_BOOL_ROW(one_pass_multicast, "one_pass_backward",
                          "batch-256 one-pass kernel: pairs of blocks share dY tiles"));
  t.push_back(SG_INT_ROW(strip_splits, "one_pass_backward",
                         "one-pass column-strip kernel: blocks per strip (0: the measured rule)", strip_splits_check));
  // --- fast path small_batch_forward
  t.push_back(SG_BOOL_ROW(small_batch_forward, "small_batch_forward",
                          "our small-batch hidden-layer forwards (batch fetch folded into the first)"));
  // --- fast path small_forward_dgrad
  t.push_back(SG_BOOL_ROW(classifier_mma, "small_forward_dgrad",
                          "the classifier forward on tensor cores (batch 256/1024; off: a warp per output)"));
  return t;
}

#undef SG_BOOL_ROW
#undef SG_INT_ROW

const char* type_text(std::size_t index) {
  switch (index) {
    case 0: return "true or false";
    case 1: return "an integer";
    default: return "a string";
  }
}

}  // namespace

std::string BackendOptionRow::problem(const BackendOptionValue& value) const {
  const BackendOptionValue d = default_value();
  if (value.index() != d.index()) return fmt::format("expected {}", type_text(d.index()));
  if (!choices.empty()) {
    const auto& name = std::get<std::string>(value);
    if (std::find(choices.begin(), choices.end(), name) == choices.end())
      return fmt::format("'{}' is not one of {}", name, fmt::join(choices, ", "));
  }
  return check ? check(value) : std::string();
}

std::string BackendOptionRow::flag() const {
  std::string f = "--" + key;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

const std::vector<BackendOptionRow>& backend_option_table() {
  static const std::vector<BackendOptionRow> table = make_table();
  return table;
}

const BackendOptionRow* find_backend_option(std::string_view key) {
  for (const auto& row : backend_option_table())
    if (row.key == key) return &row;
  return nullptr;
}

std::string backend_option_text(const BackendOptionValue& value) {
  if (const bool* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<std::int64_t>(&value)) return std::to_string(*i);
  return std::get<std::string>(value);
}

}  // namespace sg
