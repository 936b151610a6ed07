#pragma once
// One lowered graph on the GPU: the graph covered by the CUDA lowerings
// (runtime/cuda/lowering.hpp), an arena sized by the memory plan, parameter
// buffers shared with other programs, device-resident optimizer scalars, and
// each launch recorded by its lowering. record() enqueues one step,
// record_steps() several (one launch for all of them where a lowering keeps
// state on chip); they are what CUDA-graph capture records.
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/graph.hpp"
#include "ops/cuda/cublaslt_matmul.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/kernels.hpp"
#include "runtime/backend_options.hpp"
#include "runtime/cuda/device_values.hpp"
#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/cuda/scalar_uploader.hpp"
#include "runtime/cuda/stream_plan.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"

namespace sg::cuda {

struct ProgramOptions {
  BackendOptions backend;
  double learning_rate = 0.0;  // initial value of every sgd_update's lr (set_learning_rate changes it)
  const NcclCommunicator* communicator = nullptr;  // data parallel (issue 25): what all_reduce_mean launches use
  // State values kept with the parameters (DeviceValues shared by name)
  // because another program reads them: the running statistics the eval
  // program uses.
  std::set<std::string> shared_state;
  // Allocates the arena instead of cudaMalloc when set: a data-parallel
  // training program's arena in an NCCL symmetric-memory window
  // (runtime/cuda/nccl_window.hpp); the pointer owns the memory.
  std::function<std::shared_ptr<void>(std::size_t bytes)> arena_memory;
  // Each all_reduce_mean's inputs, and its outputs, one after another in one
  // arena buffer (join_buffers), so a bucket is one span for one collective.
  bool contiguous_buckets = false;
};

class CudaProgram {
 public:
  // `params` holds parameter buffers (and options.shared_state's) shared with
  // other programs; every other graph-owned value gets a buffer of this
  // program's own.
  CudaProgram(sg::Graph graph, DeviceValues& params, const LtHandle& lt, ProgramOptions options, cudaStream_t stream);
  ~CudaProgram();
  CudaProgram(const CudaProgram&) = delete;
  CudaProgram& operator=(const CudaProgram&) = delete;

  const sg::Graph& graph() const { return graph_; }
  const Schedule& schedule() const { return schedule_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  // The fast paths (runtime/cuda/fast_paths/) with no launch in the schedule, each with why not.
  const std::vector<DeclinedFastPath>& declined_fast_paths() const { return declined_; }
  // Why a fast path declined this graph ("" when it has a launch here).
  std::string declined_reason(std::string_view fast_path) const;
  // Whether one launch runs the whole step (a whole-step fast path took the graph).
  bool uses_whole_step() const;
  // Where the constructor's wall time went (cover and memory plan, device
  // buffers, recording the launches), for the run's time breakdown.
  const std::vector<std::pair<std::string, double>>& setup_parts() const { return setup_parts_; }

  // Which launches run on the communication stream or the gradient stream,
  // and where they fork and join (stream_plan.hpp); no side launch: one stream.
  const StreamPlan& stream_plan() const { return streams_; }

  // One step, every launch: on `stream`, and the side launches on the
  // program's communication or gradient stream, forked from and joined back
  // to `stream`.
  void record(cudaStream_t stream) const;
  void record_steps(cudaStream_t stream, std::int64_t steps) const;
  // One launch alone on `stream`, whatever its stream in a step (warm-up, per-launch profiles).
  void record_launch(std::size_t index, cudaStream_t stream) const;
  // e.g. "L3 cublaslt_matmul (matmul+bias_add+relu) cuBLASLt"
  std::string launch_label(std::size_t index) const;

  void* device_ptr(ValueId id) const;
  DeviceBuffer& owned(const std::string& name);  // this program's graph-owned buffers
  // To be called, in stream order before the next step, whenever the host
  // wrote parameters (initial values, a resumed checkpoint): launches that
  // keep state derived from them rebuild it (RecordedLaunch::parameters_written).
  void parameters_written(cudaStream_t stream) const;
  // New learning rate for every sgd_update, in stream order, no re-capture.
  void set_learning_rate(double lr, cudaStream_t stream);
  // Per-phase profile (median us) of a launch that runs a whole step; empty otherwise.
  std::vector<std::pair<std::string, double>> profile_whole_step(int repeats, cudaStream_t stream) const;
  // Fills the arena with NaN bytes so a read of an unwritten element shows
  // (then refills what parameters_written fills: the carried compute copies).
  void poison_arena(cudaStream_t stream) const;
  // ZeRO-1 (issue 38): after sharded updates a rank's parameters and their
  // optimizer state are current in its own range only. This fills every
  // range of each from the rank that owns it (in-place all-gathers on
  // `stream`), for whatever reads them next outside the step (eval,
  // checkpoints). Every rank calls it at the same point. False, and nothing
  // launched, when the graph shards nothing.
  bool gather_shards(cudaStream_t stream) const;

 private:
  class Binding;
  class SideStream;
  void bind_values();
  void upload_scalars(double lr, cudaStream_t stream, bool synchronous);

  sg::Graph graph_;
  ProgramOptions options_;
  std::vector<std::unique_ptr<CudaLowering>> lowerings_;
  std::vector<DeclinedFastPath> declined_;
  Schedule schedule_;
  StreamPlan streams_;
  std::unique_ptr<SideStream> communication_;  // only when streams_.forks()
  std::unique_ptr<SideStream> gradients_[2];   // per gradient lane the plan uses (streams_.gradient_lanes())
  MemoryPlan plan_;
  std::vector<int> buffer_of_value_, buffer_of_mask_;
  std::vector<std::size_t> offset_in_buffer_;  // per value id, within its arena buffer
  std::shared_ptr<void> arena_;  // plan_.arena_bytes: a DeviceBuffer or options_.arena_memory's
  char* arena_base_ = nullptr;
  DeviceValues own_;
  DeviceValues& params_;
  std::vector<void*> value_ptr_;
  std::vector<NodeId> update_nodes_;  // order of entries in update_scalars_
  mutable std::shared_ptr<cudnn::Handle> cudnn_;  // made when a launch asks (BindContext::cudnn); outlives recorded_
  // The launches' workspace (BindContext::workspace), one per compute stream
  // ([0] the step's, [1 + lane] the gradient streams'): launches on one
  // stream run one after another and share it; other streams' may overlap.
  mutable std::size_t workspace_request_[3] = {0, 0, 0};
  mutable void* workspace_ptr_[3] = {nullptr, nullptr, nullptr};
  DeviceBuffer workspace_[3];
  // Each gradient stream's cuBLASLt handle, for its own workspace; made when one of its launches asks.
  mutable std::unique_ptr<LtHandle> gradient_lt_[2];
  DeviceBuffer update_scalars_;       // UpdateScalars[update_nodes_.size()]
  DeviceBuffer constants_;         // one and zero, float and half
  DeviceBuffer scratch_float_;     // loss output of a lone softmax_xent_backward
  std::unique_ptr<ScalarUploader> uploader_;
  std::vector<std::unique_ptr<RecordedLaunch>> recorded_;
  std::vector<std::pair<std::string, double>> setup_parts_;  // setup_parts()
};

}  // namespace sg::cuda
