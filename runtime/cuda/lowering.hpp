#pragma once
// A way of running a set of graph nodes on the GPU: one file per lowering in
// runtime/cuda/lowerings/, each a `match` (which nodes it covers and whether
// it fits this device, dtype, shape and the backend options: the scheduler's
// side, see runtime/plan/schedule.hpp) and a `record` (the launch's buffers
// bound into an object that enqueues it). cuda_lowerings() lists them in
// priority order; nothing else knows them.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/cublaslt_matmul.hpp"
#include "ops/cuda/kernels.hpp"
#include "runtime/backend_options.hpp"
#include "runtime/plan/schedule.hpp"

namespace sg::cuda {

namespace cudnn {
class Handle;  // ops/cuda/cudnn_graph.hpp, built only with cuDNN
}

class NcclCommunicator;  // runtime/cuda/nccl_communicator.hpp, built only with NCCL (issue 25)

// A launch with its buffers bound: what CUDA-graph capture records.
class RecordedLaunch {
 public:
  virtual ~RecordedLaunch() = default;
  virtual void enqueue(cudaStream_t stream) const = 0;
  // `steps` training steps in one launch, where the lowering keeps state on
  // chip across steps (resident weights); false when it cannot.
  virtual bool enqueue_steps(cudaStream_t /*stream*/, int /*steps*/) const { return false; }
  // After the host wrote parameters (CudaProgram::parameters_written): a
  // launch that keeps state derived from them (cnn_step's fp16 parameter
  // image) rebuilds it on `stream`.
  virtual void parameters_written(cudaStream_t /*stream*/) const {}
  // What runs, beyond the lowering's name (e.g. "cuBLASLt", "one cluster").
  virtual std::string label() const { return {}; }
  // Per-phase GPU clock profile of `repeats` steps (median us per phase), for
  // kernels that run a whole step; empty for the others.
  virtual std::vector<std::pair<std::string, double>> profile_phases(int /*repeats*/, cudaStream_t) const { return {}; }
};

// What a record step can ask of the program it binds into.
class BindContext {
 public:
  virtual ~BindContext() = default;
  virtual const sg::Graph& graph() const = 0;
  virtual const Schedule& schedule() const = 0;
  virtual const BackendOptions& options() const = 0;
  virtual const LtHandle& lt() const = 0;
  virtual cudaStream_t stream() const = 0;
  // Device pointer of a value (throws when it lives only inside a fused kernel).
  virtual void* ptr(ValueId id) const = 0;
  virtual void* aux(int mask) const = 0;
  // Device-resident scalars of an sgd_update or adam_update node (lr).
  virtual const UpdateScalars* update_scalars(NodeId sgd_update) const = 0;
  // Device constants 1 and 0 (float and half) for cuBLASLt alpha/beta.
  virtual const void* one(bool half) const = 0;
  virtual const void* zero(bool half) const = 0;
  // A float the launch may write and nobody reads (a lone xent backward's loss).
  virtual float* scratch_float() const = 0;
  // The data-parallel run's NCCL communicator (all_reduce_mean); null otherwise.
  virtual const NcclCommunicator* communicator() const { return nullptr; }
  // This process's rank and the number of ranks (0 of 1 without a process
  // group): what a sharded update (ZeRO-1, issue 38) needs without NCCL's types.
  struct GroupRank {
    int rank = 0, ranks = 1;
  };
  virtual GroupRank group_rank() const { return {}; }
  // The program's cuDNN handle, made on first use (throws in a build without cuDNN).
  virtual const cudnn::Handle& cudnn() const = 0;
  // A device workspace of at least `bytes`, shared by every launch of the
  // program (launches on one stream never overlap). The returned address
  // holds the pointer once every launch is recorded: read it when enqueuing.
  virtual void* const* workspace(std::size_t bytes) const = 0;
};

// Which stream a launch runs on: the step's, or the program's communication
// stream, forked from the step's stream and joined back inside the same
// capture so the launch overlaps the launches between (runtime/cuda/stream_plan.hpp).
enum class LaunchStream { step, communication };

class CudaLowering : public Lowering {
 public:
  // The gradient all-reduce (nccl_all_reduce) says communication; every other lowering the step's stream.
  virtual LaunchStream launch_stream() const { return LaunchStream::step; }
  // Whether `launch` stays on the gradient stream where it forks after the
  // data-gradient chain's last launch (stream_plan.cpp moves such launches
  // to the step's stream): a large update apart from the others, which then
  // runs beside the last weight gradients instead of before or after them.
  virtual bool runs_beside_chain_end(const Launch&) const { return false; }
  // Whether its one launch is a whole training step (whole_step,
  // resident_step, cnn_step): such a schedule has no other launch, but in a
  // data-parallel rank (cnn_step's gradients out, then the update stage's
  // all-reduces and updates).
  virtual bool covers_whole_step() const { return false; }
  // Binds `launch` (the launch at `index` of the schedule; one of this
  // lowering's) to the program's buffers.
  virtual std::unique_ptr<RecordedLaunch> record(const Launch& launch, std::size_t index,
                                                 const BindContext& context) const = 0;
  // Whether match() asks the GPU (compute capability, shared memory): such
  // lowerings are left out where no GPU is present (`inspect` on a CPU machine).
  virtual bool asks_device() const { return false; }
};

// The lowerings the options allow, highest priority first.
std::vector<std::unique_ptr<CudaLowering>> cuda_lowerings(const BackendOptions& options, bool device_present = true);
std::vector<const Lowering*> as_lowerings(const std::vector<std::unique_ptr<CudaLowering>>& lowerings);

// The lowering of a launch this backend scheduled.
const CudaLowering& cuda_lowering_of(const Launch& launch);

}  // namespace sg::cuda
