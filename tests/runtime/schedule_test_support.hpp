#pragma once
// What the schedule tests share (test_schedule.cpp, test_activation_schedule.cpp,
// test_cnn_schedule.cpp): the reference MLP's fused graph, backend options
// that turn fast paths off, a cover with the CUDA lowerings (no GPU needed:
// lowerings that ask the device are left out) and queries on its launches.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/mlp.hpp"
#include "models/sequential.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"

namespace sg::schedule_test {

inline Graph reference_fused(double momentum = 0.0, DType weights = DType::f16) {
  MlpSpec spec;
  spec.layers = {784, 128, 128, 128, 10};
  spec.weight_dtype = weights;
  return build_training_stages(spec, {0.003, momentum, 0.0}).fused;
}

// Our fused kernels but not the small-batch forwards and the first layer's folded update.
inline BackendOptions without_forwards() {
  BackendOptions o;
  o.whole_step = false;
  o.small_batch_forward = false;
  o.fold_input_update = false;
  return o;
}

// The two-pass schedule: cuBLASLt and the plain kernels, none of our fused ones.
inline BackendOptions two_pass() {
  BackendOptions o;
  o.one_pass_backward = false;
  o.whole_step = false;
  return o;
}

// A schedule together with the lowerings its launches point to.
struct Lowered {
  std::vector<std::unique_ptr<cuda::CudaLowering>> lowerings;
  Schedule schedule;
};

inline Lowered lower(const Graph& g, const BackendOptions& options) {
  Lowered l;
  l.lowerings = cuda::cuda_lowerings(options, /*device_present=*/false);
  l.schedule = build_schedule(g, cuda::as_lowerings(l.lowerings));
  return l;
}

inline std::string name_of(const Launch& l) { return std::string(l.lowering->name()); }

// "lowering[note]" of every launch, counted.
inline std::map<std::string, int> launch_counts(const Graph& g, const Schedule& s) {
  std::map<std::string, int> counts;
  for (const auto& l : s.launches) {
    std::string key = name_of(l);
    if (const std::string note = l.lowering->describe(g, l); !note.empty()) key += "[" + note + "]";
    if (key == "elementwise") key = std::string(op_name(g.node(l.nodes[0]).op));
    ++counts[key];
  }
  return counts;
}

inline bool reads(const Launch& l, ValueId v) { return std::find(l.reads.begin(), l.reads.end(), v) != l.reads.end(); }
inline bool writes(const Launch& l, ValueId v) { return std::find(l.writes.begin(), l.writes.end(), v) != l.writes.end(); }
inline bool updates(const Launch& l, ValueId v) { return std::find(l.updates.begin(), l.updates.end(), v) != l.updates.end(); }

inline std::vector<std::size_t> sizes_of(const Graph& g) {
  std::vector<std::size_t> bytes;
  for (const auto& v : g.values()) bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
  return bytes;
}

inline constexpr const char* kIntoParam = "into=param(alpha=-lr,beta=1-lr*wd)";

}  // namespace sg::schedule_test
