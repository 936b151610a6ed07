#pragma once
// One lowered graph on the GPU: the schedule bound to device buffers (an
// arena sized by the memory plan, shared parameter buffers), one cuBLASLt
// matmul object per matmul launch, and device-resident optimizer scalars.
// record() enqueues one step, record_steps() several (one launch for all of
// them when the whole-step kernel keeps the weights resident); they are what
// CUDA-graph capture records.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.hpp"
#include "ops/cuda/cublaslt_matmul.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/kernels.hpp"
#include "runtime/cuda/device_values.hpp"
#include "runtime/cuda/scalar_uploader.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"

namespace sg::cuda {

struct ProgramOptions {
  Accumulate accumulate = Accumulate::f32;
  bool autotune = false;
  // Run a graph that is exactly an MLP training step as one whole-step
  // kernel when the kernel supports its sizes (else the per-group schedule).
  bool whole_step = true;
  // Run a layer's dgrad and its weight's SGD update as one pass over the
  // weights where the sizes fit (batch 16/32, fp16, no momentum), with the
  // first layer's update folded into the launch above it; and the hidden
  // layers' forwards as our small-batch dependent launches, the batch fetch
  // folded into the first (off: cuBLASLt for every matmul but the
  // classifier's tiny-dimension ones).
  bool one_pass_backward = true;
  // Steps the caller records per launch (record_steps): above one, a
  // whole-step lowering that keeps the weights on chip across steps pays off.
  int steps_per_launch = 1;
};

class CudaProgram {
 public:
  // `params` holds parameter buffers shared with other programs; every other
  // graph-owned value gets a buffer of this program's own.
  CudaProgram(sg::Graph graph, DeviceValues& params, const LtHandle& lt, ProgramOptions options, cudaStream_t stream);
  ~CudaProgram();
  CudaProgram(const CudaProgram&) = delete;
  CudaProgram& operator=(const CudaProgram&) = delete;

  const sg::Graph& graph() const { return graph_; }
  const Schedule& schedule() const { return schedule_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  // Why the whole-step kernel is not used ("" when it is).
  const std::string& whole_step_note() const { return whole_step_note_; }
  bool uses_whole_step() const { return whole_step_note_.empty(); }

  void record(cudaStream_t stream) const;                 // one step, every launch
  void record_steps(cudaStream_t stream, std::int64_t steps) const;
  void record_launch(std::size_t index, cudaStream_t stream) const;
  std::string launch_label(std::size_t index) const;     // e.g. "L3 matmul[relu_aux_bias] n3 n4 n5"

  void* device_ptr(ValueId id) const;
  DeviceBuffer& owned(const std::string& name);           // this program's graph-owned buffers
  // New learning rate for every sgd_update, in stream order, no re-capture.
  void set_learning_rate(double lr, cudaStream_t stream);
  // Runs `repeats` training steps of the whole-step kernel, timing each of
  // its phases with the GPU clock; the median per phase, in microseconds.
  std::vector<std::pair<std::string, double>> profile_whole_step(int repeats, cudaStream_t stream) const;
  // Fills the arena with NaN bytes so a read of an unwritten element shows.
  void poison_arena(cudaStream_t stream) const;

 private:
  struct Bound;  // per-launch device objects (matmul, pointers)
  Schedule choose_schedule();
  void bind_launches(const LtHandle& lt, cudaStream_t stream);
  void bind_whole_step(const WholeStepPlan& plan, Bound& bound) const;
  void bind_dgrad_wgrad(const Launch& launch, Bound& bound) const;
  void bind_output_layer_backward(const Launch& launch, Bound& bound) const;
  // `index`: the launch's place in the schedule (the first one loads its weight late).
  void bind_small_batch_forward(const Launch& launch, std::size_t index, Bound& bound) const;
  void record_single(const Node& n, cudaStream_t stream) const;
  void record_matmul(const Launch& l, const Bound& b, cudaStream_t stream) const;
  const SgdScalars* scalars_of(NodeId sgd_node) const;

  sg::Graph graph_;
  ProgramOptions options_;
  std::string whole_step_note_;
  Schedule schedule_;
  MemoryPlan plan_;
  std::vector<int> buffer_of_value_, buffer_of_mask_;
  DeviceBuffer arena_;
  DeviceValues own_;
  DeviceValues& params_;
  std::vector<void*> value_ptr_;
  std::vector<NodeId> sgd_nodes_;  // order of entries in sgd_scalars_
  DeviceBuffer sgd_scalars_;       // SgdScalars[sgd_nodes_.size()]
  DeviceBuffer constants_;         // MatmulConstants
  DeviceBuffer scratch_loss_;      // loss output of a lone softmax_xent_backward
  std::unique_ptr<ScalarUploader> uploader_;
  std::vector<std::unique_ptr<Bound>> bound_;
};

}  // namespace sg::cuda
