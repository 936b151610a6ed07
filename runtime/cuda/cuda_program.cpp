#include "runtime/cuda/cuda_program.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/optimizer_pass.hpp"
#include "ops/cuda/cuda_check.hpp"
#ifdef STEPGRAPH_HAVE_CUDNN
#include "ops/cuda/cudnn_graph.hpp"
#endif
#include "runtime/core_only_switch.hpp"
#include "runtime/plan/graph_queries.hpp"
#ifdef STEPGRAPH_HAVE_NCCL
#include "runtime/cuda/nccl_communicator.hpp"
#endif
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

bool runs_whole_step(const Schedule& s) { return s.launches.size() == 1 && cuda_lowering_of(s.launches[0]).covers_whole_step(); }

// ZeRO-1: an update that reads a sharded gradient must update this rank's
// range alone, which the multi-tensor update launches do (update_shard.hpp);
// any other lowering would run the rule over the whole parameter.
void check_sharded_updates(const sg::Graph& g, const Schedule& s) {
  for (const Launch& l : s.launches)
    for (NodeId id : l.nodes) {
      const Node& n = g.node(id);
      if (!is_update_rule(n.op)) continue;
      if (gradient_shards(g, n.inputs[1]) <= 1) continue;
      const std::string_view by = l.lowering->name();
      if (by != "sgd_multi_tensor" && by != "update_multi_tensor")
        throw CudaError(fmt::format("the sharded update of {} was taken by {}, which updates whole parameters",
                                    g.value(n.inputs[0]).name, by));
    }
}

}  // namespace

// A side stream of a step (the communication stream, a gradient stream) and
// one event pair per launch it runs:
// `forked` recorded on the step's stream where the launch forks, `done` on
// this stream after it (stream_plan.hpp). The communication stream has the
// device's highest priority, so an all-reduce's blocks are scheduled as soon
// as SMs free up rather than after the queued backward kernels. The gradient
// stream has the lowest (the step stream's), or the highest when the backend
// option gradient_stream_first asks. Captured kernels keep their stream's
// priority, and the graphs are instantiated to use it (GraphExec).
class CudaProgram::SideStream {
 public:
  enum class Priority { highest, lowest };
  // `runs`: per launch, whether it runs on this stream (it gets the events).
  SideStream(const std::vector<bool>& runs, Priority priority) {
    try {
      int least = 0, greatest = 0;
      SG_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      SG_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking,
                                                 priority == Priority::highest ? greatest : least));
      forked_.assign(runs.size(), nullptr);
      done_.assign(runs.size(), nullptr);
      for (std::size_t i = 0; i < runs.size(); ++i) {
        if (!runs[i]) continue;
        SG_CUDA_CHECK(cudaEventCreateWithFlags(&forked_[i], cudaEventDisableTiming));
        SG_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~SideStream() { release(); }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  // Launch `index` on this stream, after everything enqueued on `step` so far.
  void fork(std::size_t index, cudaStream_t step, const RecordedLaunch& launch) const {
    SG_CUDA_CHECK(cudaEventRecord(forked_[index], step));
    SG_CUDA_CHECK(cudaStreamWaitEvent(stream_, forked_[index], 0));
    launch.enqueue(stream_);
    SG_CUDA_CHECK(cudaEventRecord(done_[index], stream_));
  }
  // `step` waits for launch `index` of this stream.
  void join(std::size_t index, cudaStream_t step) const { SG_CUDA_CHECK(cudaStreamWaitEvent(step, done_[index], 0)); }
  // This stream waits for launch `index` of another side stream (StreamPlan::waits_for), already recorded.
  void wait_for(const SideStream& other, std::size_t index) const {
    SG_CUDA_CHECK(cudaStreamWaitEvent(stream_, other.done_[index], 0));
  }

 private:
  void release() noexcept {
    for (auto* events : {&forked_, &done_})
      for (cudaEvent_t& e : *events)
        if (e) {
          if (const cudaError_t status = cudaEventDestroy(e); status != cudaSuccess)
            std::fprintf(stderr, "warning: cudaEventDestroy failed: %s\n", cudaGetErrorString(status));
          e = nullptr;
        }
    if (stream_) {
      if (const cudaError_t status = cudaStreamDestroy(stream_); status != cudaSuccess)
        std::fprintf(stderr, "warning: cudaStreamDestroy failed: %s\n", cudaGetErrorString(status));
      stream_ = nullptr;
    }
  }

  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> forked_, done_;  // per launch; null for the other streams'
};

// What a lowering's record step sees of this program.
class CudaProgram::Binding final : public BindContext {
 public:
  // gradient_lane >= 0: the launches recorded through this binding run on
  // that gradient stream, beside the step stream's: their own workspaces.
  Binding(const CudaProgram& p, const LtHandle& lt, cudaStream_t stream, int gradient_lane)
      : p_(p), lt_(lt), stream_(stream), side_(gradient_lane + 1) {}
  const sg::Graph& graph() const override { return p_.graph_; }
  const Schedule& schedule() const override { return p_.schedule_; }
  const BackendOptions& options() const override { return p_.options_.backend; }
  const LtHandle& lt() const override {
    if (side_ == 0) return lt_;
    auto& handle = p_.gradient_lt_[side_ - 1];
    if (!handle) handle = std::make_unique<LtHandle>();
    return *handle;
  }
  cudaStream_t stream() const override { return stream_; }
  void* ptr(ValueId id) const override { return p_.device_ptr(id); }
  void* aux(int mask) const override {
    const int slot = p_.buffer_of_mask_.at(static_cast<std::size_t>(mask));
    return p_.arena_base_ + p_.plan_.slots[static_cast<std::size_t>(slot)].offset;
  }
  const UpdateScalars* update_scalars(NodeId sgd_update) const override {
    for (std::size_t i = 0; i < p_.update_nodes_.size(); ++i)
      if (p_.update_nodes_[i] == sgd_update) return p_.update_scalars_.as<UpdateScalars>() + i;
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
  GroupRank group_rank() const override {
#ifdef STEPGRAPH_HAVE_NCCL
    if (const NcclCommunicator* comm = p_.options_.communicator) return {comm->rank(), comm->world_size()};
#endif
    return {};
  }
  const cudnn::Handle& cudnn() const override {
#ifdef STEPGRAPH_HAVE_CUDNN
    if (!p_.cudnn_) p_.cudnn_ = std::make_shared<cudnn::Handle>();
    return *p_.cudnn_;
#else
    throw CudaError("this build has no cuDNN (CMake did not find cuDNN 9): convolutions cannot run on CUDA");
#endif
  }
  void* const* workspace(std::size_t bytes) const override {
    p_.workspace_request_[side_] = std::max(p_.workspace_request_[side_], bytes);
    return &p_.workspace_ptr_[side_];
  }

 private:
  const CudaProgram& p_;
  const LtHandle& lt_;
  cudaStream_t stream_;
  int side_;  // index of the workspace
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
  if (core_only_forced_for_tests()) options_.backend.core_only = true;  // the GPU suite's --core-only run
  lowerings_ = cuda_lowerings(options_.backend);
  schedule_ = build_schedule(graph_, as_lowerings(lowerings_));
  check_sharded_updates(graph_, schedule_);
  // Every fast path without a launch, and why (asked of the records; this program names no lowering).
  declined_ = ::sg::cuda::declined_fast_paths(graph_, schedule_, options_.backend, /*device_present=*/true);
  streams_ = plan_streams(graph_, schedule_, options_.backend);
  if (streams_.forks())
    communication_ = std::make_unique<SideStream>(streams_.on_communication, SideStream::Priority::highest);
  for (int lane = 0; lane < streams_.gradient_lanes(); ++lane) {
    std::vector<bool> runs(schedule_.launches.size(), false);
    for (std::size_t i = 0; i < runs.size(); ++i)
      runs[i] = streams_.on_gradient_stream[i] && streams_.gradient_lane[i] == lane;
    gradients_[lane] = std::make_unique<SideStream>(
        runs, options_.backend.gradient_stream_first ? SideStream::Priority::highest : SideStream::Priority::lowest);
  }
  end_part("cover (schedule)");
  bind_values();
  for (const Node& n : graph_.nodes())
    if (is_update_rule(n.op)) update_nodes_.push_back(n.id);
  const std::size_t scalar_bytes = std::max<std::size_t>(1, update_nodes_.size()) * sizeof(UpdateScalars);
  update_scalars_ = DeviceBuffer(scalar_bytes);
  uploader_ = std::make_unique<ScalarUploader>(scalar_bytes);
  upload_scalars(options_.learning_rate, stream, /*synchronous=*/true);

  MatmulConstants constants;
  constants.one_h = __float2half(1.0f);
  constants.zero_h = __float2half(0.0f);
  constants_ = DeviceBuffer(sizeof constants);
  constants_.upload(&constants, sizeof constants);
  scratch_float_ = DeviceBuffer(sizeof(float));

  end_part("memory plan, device buffers and scalars");

  const Binding step_binding(*this, lt, stream, -1), lane_binding[2] = {{*this, lt, stream, 0}, {*this, lt, stream, 1}};
  std::map<std::string, std::pair<int, double>> record_seconds;  // by lowering: launches, seconds
  for (std::size_t i = 0; i < schedule_.launches.size(); ++i) {
    const Launch& l = schedule_.launches[i];
    const auto record_start = std::chrono::steady_clock::now();
    recorded_.push_back(
        cuda_lowering_of(l).record(l, i, streams_.on_gradient_stream[i] ? lane_binding[streams_.gradient_lane[i]]
                                                                         : step_binding));
    auto& [count, seconds] = record_seconds[std::string(l.lowering->name())];
    ++count;
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - record_start).count();
  }
  // Each stream's workspace (cuDNN's, our convolutions'), sized by its largest request.
  for (int w = 0; w < 3; ++w) {
    workspace_[w] = DeviceBuffer(workspace_request_[w]);
    workspace_ptr_[w] = workspace_[w].data();
  }
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
  keep_live_until_joined(request, schedule_, streams_);  // launches beside a side launch do not reuse its buffers
  if (options_.contiguous_buckets)
    for (const Launch& l : schedule_.launches)
      for (NodeId id : l.nodes)
        if (const Node& n = graph_.node(id); n.op == OpKind::all_reduce_mean) {
          join_buffers(request, n.inputs);  // a value without an arena buffer: the bucket stays apart
          join_buffers(request, n.outputs);
        }
  buffer_of_value_ = std::move(request.buffer_of_value);
  offset_in_buffer_ = std::move(request.offset_in_buffer);
  buffer_of_mask_ = std::move(request.buffer_of_mask);
  plan_ = plan_memory(std::move(request.buffers));
  if (options_.arena_memory) {
    arena_ = options_.arena_memory(plan_.arena_bytes);
    arena_base_ = static_cast<char*>(arena_.get());
  } else {
    auto buffer = std::make_shared<DeviceBuffer>(plan_.arena_bytes);
    arena_base_ = buffer->as<char>();
    arena_ = std::move(buffer);
  }
  for (const Value& v : graph_.values()) {
    void* ptr = nullptr;
    if (v.role == Role::param || (v.role == Role::state && options_.shared_state.count(v.name) != 0))
      ptr = params_.get_or_create(v).data();
    else if (is_graph_owned(v.role)) ptr = own_.get_or_create(v).data();
    else if (int slot = buffer_of_value_[static_cast<std::size_t>(v.id)]; slot >= 0)
      ptr = arena_base_ + plan_.slots[static_cast<std::size_t>(slot)].offset +
            offset_in_buffer_[static_cast<std::size_t>(v.id)];
    value_ptr_.push_back(ptr);
  }
}

void CudaProgram::upload_scalars(double lr, cudaStream_t stream, bool synchronous) {
  std::vector<UpdateScalars> scalars;
  for (NodeId id : update_nodes_) {
    const Node& n = graph_.node(id);
    if (n.op == OpKind::adam_update) {  // the update rules' kernels read lr; the rest are constant attributes
      scalars.push_back(make_update_scalars(float(lr), 0.f, float(n.attr<AdamUpdateAttrs>().weight_decay)));
      continue;
    }
    if (n.op == OpKind::rmsprop_update) {
      scalars.push_back(make_update_scalars(float(lr), 0.f, float(n.attr<RmspropUpdateAttrs>().weight_decay)));
      continue;
    }
    const auto& a = n.attr<SgdUpdateAttrs>();
    scalars.push_back(make_update_scalars(float(lr), float(a.momentum), float(a.weight_decay)));
  }
  if (scalars.empty()) return;
  if (synchronous) update_scalars_.upload(scalars.data(), scalars.size() * sizeof(UpdateScalars));
  else uploader_->upload(update_scalars_.data(), scalars.data(), stream);
}

bool CudaProgram::gather_shards(cudaStream_t stream) const {
  std::vector<std::pair<ValueId, std::int64_t>> sharded;  // (parameter or its state, shards)
  for (const Node& n : graph_.nodes()) {
    if (!is_update_rule(n.op)) continue;
    const std::int64_t shards = gradient_shards(graph_, n.inputs[1]);
    if (shards <= 1) continue;
    const Shape& shape = graph_.value(n.inputs[0]).shape;
    for (ValueId v : n.inputs) {
      const Role role = graph_.value(v).role;
      if ((role == Role::param || role == Role::state) && graph_.value(v).shape == shape)
        sharded.emplace_back(v, shards);
    }
  }
  if (sharded.empty()) return false;
#ifdef STEPGRAPH_HAVE_NCCL
  const NcclCommunicator* comm = options_.communicator;
  if (!comm) throw CudaError("gather_shards: a sharded program without its NCCL communicator");
  SG_NCCL_CHECK(ncclGroupStart());
  for (const auto& [v, shards] : sharded) {
    const Value& value = graph_.value(v);
    const auto count = static_cast<std::size_t>(element_count(value.shape) / shards);
    auto* base = static_cast<char*>(device_ptr(v));
    SG_NCCL_CHECK(ncclAllGather(base + static_cast<std::size_t>(comm->rank()) * count * dtype_size(value.dtype), base,
                                count, *nccl_data_type(value.dtype), comm->get(), stream));
  }
  SG_NCCL_CHECK(ncclGroupEnd());
  comm->wait_ready("ncclAllGather (sharded parameters and optimizer state)");
  return true;
#else
  (void)stream;
  throw CudaError("gather_shards: this build has no NCCL");
#endif
}

void CudaProgram::record(cudaStream_t stream) const {
  // The gradient stream pays off inside a CUDA graph, where its forks and
  // joins are graph edges; launched one by one, each would cost host calls
  // (events recorded and waited on) that the overlap does not win back, so
  // outside a capture its launches go to `stream` in schedule order.
  bool capturing = false;
  if (streams_.splits_gradients()) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    SG_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    capturing = status == cudaStreamCaptureStatusActive;
  }
  if (!communication_ && !capturing) {  // one stream: every launch in schedule order
    for (std::size_t i = 0; i < recorded_.size(); ++i) recorded_[i]->enqueue(stream);
    return;
  }
  // Without the gradient streams (outside a capture) their launches run on
  // `stream` in schedule order: no fork or join of theirs, and one that reads
  // a reduced gradient waits for the all-reduce there instead.
  const auto side_of = [&](std::size_t c) -> const SideStream& {
    return streams_.on_communication[c] ? *communication_ : *gradients_[streams_.gradient_lane[c]];
  };
  const auto join = [&](std::size_t index) {
    for (std::size_t c : streams_.joined_before(index))
      if (streams_.on_communication[c] || capturing) side_of(c).join(c, stream);
  };
  for (std::size_t i = 0; i < recorded_.size(); ++i) {
    join(i);
    if (capturing)
      for (std::size_t g : streams_.forked_before(i)) {
        const SideStream& lane = side_of(g);
        for (std::size_t c : streams_.waits_for[g]) lane.wait_for(side_of(c), c);
        lane.fork(g, stream, *recorded_[g]);
      }
    if (streams_.on_communication[i]) {
      if (capturing)
        for (std::size_t g : streams_.waits_for[i]) communication_->wait_for(side_of(g), g);
      communication_->fork(i, stream, *recorded_[i]);
    } else if (streams_.on_step_stream(i)) {
      recorded_[i]->enqueue(stream);
    } else if (!capturing) {
      for (std::size_t c : streams_.waits_for[i])
        if (streams_.on_communication[c]) communication_->join(c, stream);
      recorded_[i]->enqueue(stream);
    }
  }
  join(recorded_.size());
}

void CudaProgram::record_steps(cudaStream_t stream, std::int64_t steps) const {
  if (recorded_.size() == 1 && recorded_[0]->enqueue_steps(stream, static_cast<int>(steps))) return;
  for (std::int64_t s = 0; s < steps; ++s) record(stream);
}

void CudaProgram::parameters_written(cudaStream_t stream) const {
  for (const auto& r : recorded_) r->parameters_written(stream);
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

bool CudaProgram::uses_whole_step() const { return runs_whole_step(schedule_); }

std::string CudaProgram::declined_reason(std::string_view fast_path) const {
  for (const DeclinedFastPath& d : declined_)
    if (d.name == fast_path) return d.reason;
  return {};
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
  if (plan_.arena_bytes) launch_poison(arena_base_, plan_.arena_bytes, stream);
  parameters_written(stream);  // the compute copies carried to the next step live in the arena too
}

}  // namespace sg::cuda
