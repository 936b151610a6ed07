#include "runtime/cuda/cuda_program.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/cuda/cuda_check.hpp"
#ifdef STEPGRAPH_HAVE_CUDNN
#include "ops/cuda/cudnn_graph.hpp"
#endif
#include "runtime/cuda/lowerings/whole_step_support.hpp"
#include "runtime/cuda/scalar_uploader.hpp"

namespace sg::cuda {
namespace {

// alpha/beta values every plain matmul reads (pointer mode is device).
struct MatmulConstants {
  float one = 1.0f;
  float zero = 0.0f;
  __half one_h;
  __half zero_h;
};

std::size_t value_bytes(const Value& v) { return static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype); }

bool runs_whole_step(const Schedule& s) {
  if (s.launches.size() != 1) return false;
  const std::string_view name = s.launches[0].lowering->name();
  return name == "whole_step" || name == "resident_step" || name == "cnn_step";
}

}  // namespace

// What a lowering's record step sees of this program.
class CudaProgram::Binding final : public BindContext {
 public:
  Binding(const CudaProgram& p, const LtHandle& lt, cudaStream_t stream) : p_(p), lt_(lt), stream_(stream) {}
  const sg::Graph& graph() const override { return p_.graph_; }
  const Schedule& schedule() const override { return p_.schedule_; }
  const BackendOptions& options() const override { return p_.options_.backend; }
  const LtHandle& lt() const override { return lt_; }
  cudaStream_t stream() const override { return stream_; }
  void* ptr(ValueId id) const override { return p_.device_ptr(id); }
  void* aux(int mask) const override {
    const int slot = p_.buffer_of_mask_.at(static_cast<std::size_t>(mask));
    return p_.arena_.as<char>() + p_.plan_.slots[static_cast<std::size_t>(slot)].offset;
  }
  const SgdScalars* sgd_scalars(NodeId sgd_update) const override {
    for (std::size_t i = 0; i < p_.sgd_nodes_.size(); ++i)
      if (p_.sgd_nodes_[i] == sgd_update) return p_.sgd_scalars_.as<SgdScalars>() + i;
    throw CudaError(fmt::format("node {} is not an sgd_update or adam_update", sgd_update));
  }
  const void* one(bool half) const override {
    const auto* k = p_.constants_.as<MatmulConstants>();
    return half ? static_cast<const void*>(&k->one_h) : &k->one;
  }
  const void* zero(bool half) const override {
    const auto* k = p_.constants_.as<MatmulConstants>();
    return half ? static_cast<const void*>(&k->zero_h) : &k->zero;
  }
  float* scratch_float() const override { return p_.scratch_float_.as<float>(); }
  const NcclCommunicator* communicator() const override { return p_.options_.communicator; }
  const cudnn::Handle& cudnn() const override {
#ifdef STEPGRAPH_HAVE_CUDNN
    if (!p_.cudnn_) p_.cudnn_ = std::make_shared<cudnn::Handle>();
    return *p_.cudnn_;
#else
    throw CudaError("this build has no cuDNN (CMake did not find cuDNN 9): convolutions cannot run on CUDA");
#endif
  }
  void* const* workspace(std::size_t bytes) const override {
    p_.workspace_request_ = std::max(p_.workspace_request_, bytes);
    return &p_.workspace_ptr_;
  }

 private:
  const CudaProgram& p_;
  const LtHandle& lt_;
  cudaStream_t stream_;
};

CudaProgram::CudaProgram(sg::Graph graph, DeviceValues& params, const LtHandle& lt, ProgramOptions options,
                         cudaStream_t stream)
    : graph_(std::move(graph)), options_(options), params_(params) {
  auto part_start = std::chrono::steady_clock::now();
  const auto end_part = [&](std::string part) {
    const auto now = std::chrono::steady_clock::now();
    setup_parts_.emplace_back(std::move(part), std::chrono::duration<double>(now - part_start).count());
    part_start = now;
  };
  lowerings_ = cuda_lowerings(options_.backend);
  schedule_ = build_schedule(graph_, as_lowerings(lowerings_));
  whole_step_note_ = runs_whole_step(schedule_) ? "" : whole_step_blocker(graph_, options_.backend, false);
  if (whole_step_note_.empty() && !runs_whole_step(schedule_)) whole_step_note_ = "not chosen by the cover";
  end_part("cover (schedule)");
  bind_values();
  for (const Node& n : graph_.nodes())
    if (n.op == OpKind::sgd_update || n.op == OpKind::adam_update) sgd_nodes_.push_back(n.id);
  const std::size_t scalar_bytes = std::max<std::size_t>(1, sgd_nodes_.size()) * sizeof(SgdScalars);
  sgd_scalars_ = DeviceBuffer(scalar_bytes);
  uploader_ = std::make_unique<ScalarUploader>(scalar_bytes);
  upload_scalars(options_.learning_rate, stream, /*synchronous=*/true);

  MatmulConstants constants;
  constants.one_h = __float2half(1.0f);
  constants.zero_h = __float2half(0.0f);
  constants_ = DeviceBuffer(sizeof constants);
  constants_.upload(&constants, sizeof constants);
  scratch_float_ = DeviceBuffer(sizeof(float));

  end_part("memory plan, device buffers and scalars");

  const Binding binding(*this, lt, stream);
  std::map<std::string, std::pair<int, double>> record_seconds;  // by lowering: launches, seconds
  for (std::size_t i = 0; i < schedule_.launches.size(); ++i) {
    const Launch& l = schedule_.launches[i];
    const auto record_start = std::chrono::steady_clock::now();
    recorded_.push_back(cuda_lowering_of(l).record(l, i, binding));
    auto& [count, seconds] = record_seconds[std::string(l.lowering->name())];
    ++count;
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - record_start).count();
  }
  // The launches' shared workspace (cuDNN's), sized by the largest request.
  workspace_ = DeviceBuffer(workspace_request_);
  workspace_ptr_ = workspace_.data();
  const auto slowest = std::max_element(record_seconds.begin(), record_seconds.end(),
                                        [](const auto& a, const auto& b) { return a.second.second < b.second.second; });
  end_part(slowest == record_seconds.end()
               ? std::string("recording the launches")
               : fmt::format("recording the launches (slowest: {} x{}, {:.3f} s)", slowest->first,
                             slowest->second.first, slowest->second.second));
}

CudaProgram::~CudaProgram() = default;

// Graph-owned values get buffers (parameters shared across programs), the
// rest arena slots by the memory plan.
void CudaProgram::bind_values() {
  std::vector<std::size_t> bytes;
  for (const Value& v : graph_.values()) bytes.push_back(value_bytes(v));
  std::vector<std::size_t> mask_bytes;
  for (const AuxBuffer& aux : schedule_.aux) mask_bytes.push_back(relu_aux_bytes(aux.rows, aux.cols));
  auto request = arena_request(graph_, schedule_, bytes, mask_bytes);
  buffer_of_value_ = std::move(request.buffer_of_value);
  buffer_of_mask_ = std::move(request.buffer_of_mask);
  plan_ = plan_memory(std::move(request.buffers));
  arena_ = DeviceBuffer(plan_.arena_bytes);
  for (const Value& v : graph_.values()) {
    void* ptr = nullptr;
    if (v.role == Role::param) ptr = params_.get_or_create(v).data();
    else if (is_graph_owned(v.role)) ptr = own_.get_or_create(v).data();
    else if (int slot = buffer_of_value_[static_cast<std::size_t>(v.id)]; slot >= 0)
      ptr = arena_.as<char>() + plan_.slots[static_cast<std::size_t>(slot)].offset;
    value_ptr_.push_back(ptr);
  }
}

void CudaProgram::upload_scalars(double lr, cudaStream_t stream, bool synchronous) {
  std::vector<SgdScalars> scalars;
  for (NodeId id : sgd_nodes_) {
    const Node& n = graph_.node(id);
    if (n.op == OpKind::adam_update) {  // Adam's kernels read lr; the rest are constant attributes
      scalars.push_back(make_sgd_scalars(float(lr), 0.f, float(n.attr<AdamUpdateAttrs>().weight_decay)));
      continue;
    }
    const auto& a = n.attr<SgdUpdateAttrs>();
    scalars.push_back(make_sgd_scalars(float(lr), float(a.momentum), float(a.weight_decay)));
  }
  if (scalars.empty()) return;
  if (synchronous) sgd_scalars_.upload(scalars.data(), scalars.size() * sizeof(SgdScalars));
  else uploader_->upload(sgd_scalars_.data(), scalars.data(), stream);
}

void CudaProgram::record(cudaStream_t stream) const {
  for (std::size_t i = 0; i < recorded_.size(); ++i) recorded_[i]->enqueue(stream);
}

void CudaProgram::record_steps(cudaStream_t stream, std::int64_t steps) const {
  if (recorded_.size() == 1 && recorded_[0]->enqueue_steps(stream, static_cast<int>(steps))) return;
  for (std::int64_t s = 0; s < steps; ++s) record(stream);
}

void CudaProgram::record_launch(std::size_t index, cudaStream_t stream) const { recorded_.at(index)->enqueue(stream); }

std::string CudaProgram::launch_label(std::size_t index) const {
  const Launch& l = schedule_.launches.at(index);
  std::vector<std::string> ops;
  for (NodeId n : l.nodes) ops.push_back(std::string(op_name(graph_.node(n).op)));
  std::string what(l.lowering->name());
  if (const std::string note = l.lowering->describe(graph_, l); !note.empty()) what += fmt::format("[{}]", note);
  const std::string how = recorded_.at(index)->label();
  if (runs_whole_step(schedule_)) return fmt::format("L{} {} ({} nodes, {})", index, what, l.nodes.size(), how);
  return fmt::format("L{} {} ({}){}", index, what, fmt::join(ops, "+"), how.empty() ? "" : " " + how);
}

void CudaProgram::set_learning_rate(double lr, cudaStream_t stream) { upload_scalars(lr, stream, false); }

std::vector<std::pair<std::string, double>> CudaProgram::profile_whole_step(int repeats, cudaStream_t stream) const {
  for (const auto& r : recorded_)
    if (auto phases = r->profile_phases(repeats, stream); !phases.empty()) return phases;
  throw CudaError("profile_whole_step: this program has no whole-step launch");
}

void* CudaProgram::device_ptr(ValueId id) const {
  void* p = value_ptr_.at(static_cast<std::size_t>(id));
  if (!p) throw CudaError(fmt::format("value '{}' lives only inside a fused kernel", graph_.value(id).name));
  return p;
}

DeviceBuffer& CudaProgram::owned(const std::string& name) { return own_.at(name); }

void CudaProgram::poison_arena(cudaStream_t stream) const {
  if (arena_.bytes()) launch_poison(arena_.data(), arena_.bytes(), stream);
}

}  // namespace sg::cuda
