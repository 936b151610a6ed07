// The CUDA cover of a data-parallel training step (issue 25), no GPU needed:
// every all_reduce_mean bucket is its own nccl_all_reduce launch, and no
// launch reads a value before the launch that produces it (in particular no
// update runs before its bucket's all-reduce: the fused update lowerings,
// which read no gradient buffer, take nothing across it). World size 1 (the
// default, no --gpus) keeps the single-process schedule.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "models/mlp_program.hpp"
#include "runtime/cuda/lowering.hpp"

using namespace sg;

namespace {

struct Lowered {
  std::vector<std::unique_ptr<cuda::CudaLowering>> lowerings;
  Schedule schedule;
};

Lowered lower(const Graph& g) {
  Lowered l;
  l.lowerings = cuda::cuda_lowerings(BackendOptions{}, /*device_present=*/false);
  l.schedule = build_schedule(g, cuda::as_lowerings(l.lowerings));
  return l;
}

MlpTraining mlp(std::int64_t batch, std::int64_t ranks) {
  MlpTraining t;
  t.mlp.layers = {784, 128, 128, 128, 10};
  t.mlp.batch = batch;
  t.data_rank = ranks > 0 ? ranks - 1 : 0;
  t.data_ranks = ranks;
  return t;
}

// Every value a launch reads was produced by an earlier launch (or is graph-owned).
void check_dependencies(const Graph& g, const Schedule& s) {
  std::map<NodeId, std::size_t> launch_of;
  for (std::size_t i = 0; i < s.launches.size(); ++i) {
    for (NodeId n : s.launches[i].nodes) launch_of[n] = i;
    for (NodeId n : s.launches[i].riders) launch_of[n] = i;
  }
  for (std::size_t i = 0; i < s.launches.size(); ++i)
    for (NodeId n : s.launches[i].nodes)
      for (ValueId v : g.node(n).inputs) {
        const NodeId producer = g.value(v).producer;
        if (producer < 0) continue;
        INFO("launch " << i << " (" << s.launches[i].lowering->name() << ") reads '" << g.value(v).name << "'");
        CHECK(launch_of.at(producer) <= i);
      }
}

}  // namespace

TEST_CASE("data parallel: each gradient bucket is one nccl_all_reduce launch, before the updates that read it") {
  for (const std::int64_t batch : {32, 64, 256}) {
    for (const int variant : {0, 1, 2, 3}) {  // plain SGD, momentum, Adam, fp32 master weights + clipping
      INFO("batch " << batch << ", variant " << variant);
      MlpTraining t = mlp(batch, 2);
      if (variant == 1) t.sgd.momentum = 0.9;
      if (variant == 2) t.sgd.kind = OptimizerKind::adam;
      if (variant == 3) {
        t.mlp.weight_dtype = DType::f32;
        t.sgd.clip_grad_norm = 1.0;
      }
      const TrainingProgram p = build_mlp_program(t, 60000, 10000, ProgramTarget::cuda);
      const Lowered l = lower(p.train);
      std::size_t all_reduce = 0;
      for (const auto& launch : l.schedule.launches) {
        const bool has = std::any_of(launch.nodes.begin(), launch.nodes.end(),
                                     [&](NodeId n) { return p.train.node(n).op == OpKind::all_reduce_mean; });
        if (!has) continue;
        ++all_reduce;
        CHECK(launch.lowering->name() == "nccl_all_reduce");
        CHECK(launch.nodes.size() == 1);
        // The gradients it reduces are in the update's dtype: f32 for master weights, else f16.
        for (ValueId v : p.train.node(launch.nodes[0]).inputs)
          CHECK(p.train.value(v).dtype == (variant == 3 ? DType::f32 : DType::f16));
      }
      CHECK(all_reduce == t.mlp.layers.size() - 1);  // one bucket per layer
      if (batch == 32 && variant == 0) {
        std::string names;
        for (const auto& launch : l.schedule.launches) names += std::string(launch.lowering->name()) + " ";
        MESSAGE("784-128-128-128-10 batch 32 SGD, rank 1 of 2: " << l.schedule.launches.size() << " launches: " << names);
      }
      check_dependencies(p.train, l.schedule);
    }
  }
}

TEST_CASE("data parallel: world size 1 through the data-parallel path still reduces; a plain run is unchanged") {
  // --gpus 1: the same graph as N ranks (all-reduce over one rank), so one GPU runs the whole NCCL path.
  const TrainingProgram one = build_mlp_program(mlp(32, 1), 60000, 10000, ProgramTarget::cuda);
  const Lowered l1 = lower(one.train);
  std::size_t reduces = 0;
  for (const auto& launch : l1.schedule.launches) reduces += launch.lowering->name() == "nccl_all_reduce";
  CHECK(reduces == 4);
  check_dependencies(one.train, l1.schedule);
  // No --gpus: no all-reduce, and the schedule is exactly the single-process one.
  const TrainingProgram plain = build_mlp_program(mlp(32, 0), 60000, 10000, ProgramTarget::cuda);
  const Lowered lp = lower(plain.train);
  for (const auto& launch : lp.schedule.launches) CHECK(launch.lowering->name() != "nccl_all_reduce");
  // The reduced gradients must exist before their updates, so the fused updates give way to separate launches.
  CHECK(lp.schedule.launches.size() + 4 < l1.schedule.launches.size());
}
