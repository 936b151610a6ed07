// Lowering: one all_reduce_mean bucket (a layer's gradients, or several
// layers' joined by data_parallel.bucket_mb), in each gradient's own dtype
// (fp32 for fp32 master weights' gradients, else the compute dtype). It runs
// on the program's communication stream (launch_stream), forked from the
// step's stream right after the bucket's gradients and joined back before
// the first launch that reads the reduced gradients, all inside the one
// capture (runtime/cuda/stream_plan.hpp), so it overlaps the backward pass of
// the layers before (NCCL >= 2.9 supports capture with one process per GPU).
// The updates that read the reduced gradients are separate launches: a
// reduced gradient is materialised before its update (docs/data_parallel.md).
//
// A rank's graph pre-scales its loss gradient by 1/N (AllReduceAttrs::
// pre_scaled, issue 38), so a bucket's mean is the ranks' SUM: with the
// arena in NCCL symmetric memory (nccl_window.hpp) ONE ungrouped ncclSum over
// the bucket's span of the arena on NCCL's symmetric kernels (which take
// ncclSum, not ncclAvg; see record_symmetric), else one NCCL group of
// ncclSum calls on the ring. A bucket that is not pre-scaled (a graph built
// without it) is averaged on the ring (ncclAvg). A world of one rank copies.
// A sharded bucket (ZeRO-1) reduces-scatters instead: record_reduce_scatter.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/update_shard.hpp"
#include "runtime/cuda/nccl_communicator.hpp"
#include "runtime/plan/memory_plan.hpp"

namespace sg::cuda {
namespace {

struct BucketTensor {
  const void* in;
  void* out;
  std::size_t count;
  ncclDataType_t type;
  std::size_t bytes;
};

// Elements from the first tensor's start to the last one's end when the
// tensors follow one another at kArenaAlignment boundaries (join_buffers'
// layout, the arena's alignment), for inputs and outputs alike; nullopt
// otherwise.
std::optional<std::size_t> contiguous_span(const std::vector<BucketTensor>& tensors) {
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const std::size_t element = tensors.front().bytes / std::max<std::size_t>(tensors.front().count, 1);
  for (std::size_t i = 0; i + 1 < tensors.size(); ++i) {
    const auto next = [&](auto p, std::size_t bytes) { return align_up(address(p) + bytes, kArenaAlignment); };
    if (address(tensors[i + 1].in) != next(tensors[i].in, tensors[i].bytes) ||
        address(tensors[i + 1].out) != next(tensors[i].out, tensors[i].bytes))
      return std::nullopt;
  }
  const BucketTensor& last = tensors.back();
  return (address(last.in) + last.bytes - address(tensors.front().in)) / element;
}

// A pre-scaled bucket on NCCL's symmetric kernels (two or more ranks, the
// arena in a window, the bucket's gradients and its means each one span of
// it: CudaProgram's contiguous_buckets): ONE ungrouped ncclSum over the span,
// which is the mean. One call, not a group of one per
// tensor: NCCL 2.28.3 (H200 x2) left parts of tensors unreduced when several
// symmetric all-reduces were grouped (ncclGroupStart/End: 78,592 of 2.9M f32
// elements of the 1024-wide MLP's bucket kept their input or 0; one call per
// tensor was exact). The bytes between tensors (alignment) are reduced too,
// and no value lives there. Null when the bucket is not one span.
std::unique_ptr<RecordedLaunch> record_symmetric(const NcclCommunicator* comm, const std::vector<BucketTensor>& tensors,
                                                 std::size_t bytes) {
  const auto span = contiguous_span(tensors);
  if (!span) return nullptr;
  const BucketTensor first = tensors.front();
  auto run = [comm, first, count = *span](cudaStream_t s) {
    SG_NCCL_CHECK(ncclAllReduce(first.in, first.out, count, first.type, ncclSum, comm->get(), s));
    comm->wait_ready("ncclAllReduce (gradient bucket)");
  };
  return std::make_unique<BoundLaunch>(
      std::move(run), fmt::format("NCCL symmetric sum of one span ({} tensor{}, {} bytes), pre-scaled", tensors.size(),
                                  tensors.size() == 1 ? "" : "s", bytes));
}

// A sharded bucket (ZeRO-1, AllReduceAttrs::shards = the ranks): one
// ncclReduceScatter per tensor, rank r receiving the sum (pre-scaled) or mean
// of its range r at that range's place in the output; the rest of the output
// is left as it was. On the symmetric window the calls go one after another
// (NCCL 2.28.3 mis-reduced grouped symmetric collectives: record_symmetric),
// else as one group.
std::unique_ptr<RecordedLaunch> record_reduce_scatter(const NcclCommunicator* comm,
                                                      const std::vector<BucketTensor>& tensors, std::size_t bytes,
                                                      bool pre_scaled, std::int64_t shards) {
  check_shard_count(shards, comm->world_size(), "a gradient bucket");
  const auto rank = static_cast<std::size_t>(comm->rank());
  const ncclRedOp_t op = pre_scaled ? ncclSum : ncclAvg;
  const bool grouped = !comm->symmetric_memory();
  auto run = [comm, tensors, op, grouped, rank, shards = static_cast<std::size_t>(shards)](cudaStream_t s) {
    if (grouped) SG_NCCL_CHECK(ncclGroupStart());
    for (const BucketTensor& t : tensors) {
      const std::size_t count = t.count / shards, element = t.bytes / t.count;
      SG_NCCL_CHECK(ncclReduceScatter(t.in, static_cast<char*>(t.out) + rank * count * element, count, t.type, op,
                                      comm->get(), s));
    }
    if (grouped) SG_NCCL_CHECK(ncclGroupEnd());
    comm->wait_ready("ncclReduceScatter (sharded gradient bucket)");
  };
  return std::make_unique<BoundLaunch>(
      std::move(run), fmt::format("NCCL reduce-scatter {}, {} tensor{}, {} bytes, {} shards{}",
                                  pre_scaled ? "sum (pre-scaled)" : "mean", tensors.size(),
                                  tensors.size() == 1 ? "" : "s", bytes, shards, grouped ? ", one group" : ""));
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
      if (!nccl_data_type(g.value(in).dtype)) return std::nullopt;
    return single_unit(unit);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const NcclCommunicator* comm = c.communicator();
    if (!comm)
      throw CudaError("all_reduce_mean needs an NCCL communicator: this graph belongs to a data-parallel run (--gpus N)");
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    std::vector<BucketTensor> tensors;
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const Value& v = g.value(n.inputs[i]);
      const std::size_t count = static_cast<std::size_t>(element_count(v.shape));
      tensors.push_back(
          {c.ptr(v.id), c.ptr(n.outputs[i]), count, *nccl_data_type(v.dtype), count * dtype_size(v.dtype)});
      bytes += count * dtype_size(v.dtype);
    }
    // The mean over one rank is a copy. NCCL's own one-rank path changed the
    // bits of f16 buckets (NCCL 2.28.3 on an H200: ncclAvg of an 8385-element
    // gradient, the odd MLP's middle layer in test_data_parallel_gpu), so a
    // world of one copies (capturable, exact) and NCCL reduces from two ranks on.
    if (comm->world_size() == 1) {
      auto copy = [tensors](cudaStream_t s) {
        for (const BucketTensor& t : tensors)
          if (t.in != t.out)
            SG_CUDA_CHECK(cudaMemcpyAsync(t.out, t.in, t.bytes, cudaMemcpyDeviceToDevice, s));
      };
      return std::make_unique<BoundLaunch>(
          std::move(copy), fmt::format("one rank: a copy, {} tensor{}, {} bytes", tensors.size(),
                                       tensors.size() == 1 ? "" : "s", bytes));
    }
    const bool pre_scaled = n.attr<AllReduceAttrs>().pre_scaled;
    if (const std::int64_t shards = n.attr<AllReduceAttrs>().shards; shards > 1)
      return record_reduce_scatter(comm, tensors, bytes, pre_scaled, shards);
    // One dtype in the bucket (the usual case) can be one buffer of one window.
    bool one_type = true;
    for (const BucketTensor& t : tensors) one_type = one_type && t.type == tensors.front().type;
    if (pre_scaled && comm->symmetric_memory() && one_type)
      if (auto launch = record_symmetric(comm, tensors, bytes)) return launch;
    const ncclRedOp_t op = pre_scaled ? ncclSum : ncclAvg;
    auto run = [comm, tensors, op](cudaStream_t s) {
      SG_NCCL_CHECK(ncclGroupStart());
      for (const BucketTensor& t : tensors)
        SG_NCCL_CHECK(ncclAllReduce(t.in, t.out, t.count, t.type, op, comm->get(), s));
      SG_NCCL_CHECK(ncclGroupEnd());
      comm->wait_ready("ncclAllReduce (gradient bucket)");
    };
    return std::make_unique<BoundLaunch>(
        std::move(run),
        fmt::format("NCCL {}, {} tensor{}, {} bytes, {} ranks", pre_scaled ? "sum (pre-scaled)" : "mean",
                    tensors.size(), tensors.size() == 1 ? "" : "s", bytes, comm->world_size()));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_nccl_all_reduce_lowering() { return std::make_unique<NcclAllReduceLowering>(); }

}  // namespace sg::cuda
