#pragma once
// `stepgraph inspect`: the IR at any stage (text, JSON, DOT), the schedule,
// the memory plan, and the captured CUDA graph (GPU only).
#include <string>

#include "apps/config/train_config.hpp"

namespace sg::app {

struct InspectRequest {
  std::string format = "text";  // text | json | dot | schedule | memory | cuda-graph
  std::string stage = "fused";  // forward | backward | optimized | fused | eval
  std::string out;              // file to write ("" = stdout)
  // Data parallel (issue 25): the graphs of rank `rank` of `world_size` (0: a single-process run).
  int world_size = 0;
  int rank = 0;
};

// Returns the dump (also written atomically to request.out when set).
// Throws ConfigError for an unknown format/stage.
std::string run_inspect(const TrainConfig& config, const InspectRequest& request);

}  // namespace sg::app
