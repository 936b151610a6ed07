// Lowering: all_gather_shards (ZeRO-1, issue 38; graph/optimizer_pass.hpp) and
// all_gather_batch (weight gradients from every rank's rows, issue 38;
// graph/gathered_gradients.hpp: record_rows below). all_gather_shards is
// one ncclAllGather from this rank's range of the parameter (the range its
// sharded update wrote last step) into the gathered value, every rank's range
// at its place. On the communication stream, like the gradient buckets: the
// optimizer pass puts the gathers at the step's start in the forward's
// order, so the stream plan forks each there and joins it before the first
// matmul that reads it, and a later layer's gather runs beside the earlier
// layers' forward.
#include <memory>

#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/update_shard.hpp"
#include "runtime/cuda/nccl_communicator.hpp"

namespace sg::cuda {
namespace {

class NcclAllGatherLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "nccl_all_gather"; }
  LaunchStream launch_stream() const override { return LaunchStream::communication; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const Node& n = cover.graph().node(unit.nodes.front());
    if ((n.op != OpKind::all_gather_shards && n.op != OpKind::all_gather_batch) ||
        !nccl_data_type(cover.graph().value(n.inputs[0]).dtype))
      return std::nullopt;
    return single_unit(unit);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const NcclCommunicator* comm = c.communicator();
    if (!comm)
      throw CudaError(fmt::format("{} needs an NCCL communicator: this graph belongs to a data-parallel run",
                                  op_name(c.graph().node(l.nodes.front()).op)));
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    if (n.op == OpKind::all_gather_batch) return record_rows(n, c, *comm);
    const Value& param = g.value(n.inputs[0]);
    const std::int64_t shards = n.attr<AllReduceAttrs>().shards;
    check_shard_count(shards, comm->world_size(), param.name);
    const std::size_t count = static_cast<std::size_t>(element_count(param.shape) / shards);
    const std::size_t bytes = count * dtype_size(param.dtype);
    const char* own = static_cast<const char*>(c.ptr(param.id)) + static_cast<std::size_t>(comm->rank()) * bytes;
    void* out = c.ptr(n.outputs[0]);
    const ncclDataType_t type = *nccl_data_type(param.dtype);
    auto run = [comm, own, out, count, type](cudaStream_t s) {
      SG_NCCL_CHECK(ncclAllGather(own, out, count, type, comm->get(), s));
      comm->wait_ready("ncclAllGather (sharded parameter)");
    };
    return std::make_unique<BoundLaunch>(
        std::move(run), fmt::format("NCCL all-gather of {} shards, {} bytes each", shards, bytes));
  }

 private:
  // all_gather_batch: every rank's rows, rank r's at block r (ncclAllGather's
  // order), from this rank's value. In the window (symmetric memory) both are
  // at the same offsets on every rank: NCCL's symmetric kernels store straight
  // into the peers' outputs.
  static std::unique_ptr<RecordedLaunch> record_rows(const Node& n, const BindContext& c,
                                                     const NcclCommunicator& comm) {
    const Value& rows = c.graph().value(n.inputs[0]);
    const std::int64_t ranks = n.attr<AllReduceAttrs>().shards;
    if (ranks != comm.world_size())
      throw CudaError(fmt::format("all_gather_batch of {} gathers {} ranks' rows, but the process group has {}",
                                  rows.name, ranks, comm.world_size()));
    const std::size_t count = static_cast<std::size_t>(element_count(rows.shape));
    const void* own = c.ptr(rows.id);
    void* out = c.ptr(n.outputs[0]);
    const ncclDataType_t type = *nccl_data_type(rows.dtype);
    const NcclCommunicator* group = &comm;
    auto run = [group, own, out, count, type](cudaStream_t s) {
      SG_NCCL_CHECK(ncclAllGather(own, out, count, type, group->get(), s));
      group->wait_ready("ncclAllGather (every rank's rows)");
    };
    return std::make_unique<BoundLaunch>(
        std::move(run), fmt::format("NCCL all-gather of {} ranks' rows of {}, {} bytes each", ranks, rows.name,
                                    count * dtype_size(rows.dtype)));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_nccl_all_gather_lowering() { return std::make_unique<NcclAllGatherLowering>(); }

}  // namespace sg::cuda
