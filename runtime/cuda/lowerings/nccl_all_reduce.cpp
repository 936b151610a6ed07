// Lowering: one all_reduce_mean bucket (a layer's gradients) as one NCCL
// group of ncclAllReduce(ncclAvg) calls, in place, in each gradient's own
// dtype (fp32 for fp32 master weights' gradients, else the compute dtype).
// It runs on the program's communication stream (launch_stream), forked from
// the step's stream right after the bucket's gradients and joined back before
// the first launch that reads the reduced gradients, all inside the one
// capture (runtime/cuda/stream_plan.hpp), so it overlaps the backward pass of
// the layers before (NCCL >= 2.9 supports capture with one process per GPU).
// The updates that read the reduced gradients are separate launches: a
// reduced gradient is materialised before its update (docs/data_parallel.md).
// A world of one rank copies instead (below: NCCL's one-rank mean changed
// f16 bits).
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/nccl_communicator.hpp"

namespace sg::cuda {
namespace {

std::optional<ncclDataType_t> nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    default: return std::nullopt;
  }
}

class NcclAllReduceLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "nccl_all_reduce"; }
  LaunchStream launch_stream() const override { return LaunchStream::communication; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (unit.fusion_group >= 0) return std::nullopt;
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::all_reduce_mean) return std::nullopt;
    for (ValueId in : n.inputs)
      if (!nccl_type(g.value(in).dtype)) return std::nullopt;
    return single_unit(unit);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const NcclCommunicator* comm = c.communicator();
    if (!comm)
      throw CudaError("all_reduce_mean needs an NCCL communicator: this graph belongs to a data-parallel run (--gpus N)");
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    struct Tensor {
      const void* in;
      void* out;
      std::size_t count;
      ncclDataType_t type;
      std::size_t bytes;
    };
    std::vector<Tensor> tensors;
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const Value& v = g.value(n.inputs[i]);
      const std::size_t count = static_cast<std::size_t>(element_count(v.shape));
      tensors.push_back({c.ptr(v.id), c.ptr(n.outputs[i]), count, *nccl_type(v.dtype), count * dtype_size(v.dtype)});
      bytes += count * dtype_size(v.dtype);
    }
    // The mean over one rank is a copy. NCCL's own one-rank path changed the
    // bits of f16 buckets (NCCL 2.28.3 on an H200: ncclAvg of an 8385-element
    // gradient, the odd MLP's middle layer in test_data_parallel_gpu), so a
    // world of one copies (capturable, exact) and NCCL reduces from two ranks on.
    if (comm->world_size() == 1) {
      auto copy = [tensors](cudaStream_t s) {
        for (const Tensor& t : tensors)
          if (t.in != t.out)
            SG_CUDA_CHECK(cudaMemcpyAsync(t.out, t.in, t.bytes, cudaMemcpyDeviceToDevice, s));
      };
      return std::make_unique<BoundLaunch>(
          std::move(copy), fmt::format("one rank: a copy, {} tensor{}, {} bytes", tensors.size(),
                                       tensors.size() == 1 ? "" : "s", bytes));
    }
    auto run = [comm, tensors](cudaStream_t s) {
      SG_NCCL_CHECK(ncclGroupStart());
      for (const Tensor& t : tensors)
        SG_NCCL_CHECK(ncclAllReduce(t.in, t.out, t.count, t.type, ncclAvg, comm->get(), s));
      SG_NCCL_CHECK(ncclGroupEnd());
      comm->wait_ready("ncclAllReduce (gradient bucket)");
    };
    return std::make_unique<BoundLaunch>(
        std::move(run), fmt::format("NCCL, {} tensor{}, {} bytes, {} ranks", tensors.size(),
                                    tensors.size() == 1 ? "" : "s", bytes, comm->world_size()));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_nccl_all_reduce_lowering() { return std::make_unique<NcclAllReduceLowering>(); }

}  // namespace sg::cuda
