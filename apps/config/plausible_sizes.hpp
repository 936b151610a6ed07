#pragma once
// Upper bounds on the sizes a config may ask for, checked right after its
// values are read (before the cross-key rules, the graph or any data): a
// model.layers list of millions of entries, a layer billions wide or a
// kernel that overflows the shape arithmetic is a typo or a generated file
// gone wrong, and gets one error naming the key instead of minutes of work.
// What fits in memory is checked later, against the machine
// (apps/memory_estimate.hpp); these bounds only keep every count far from
// overflowing and every list short enough to build a graph of.
#include <cstdint>

#include <yaml-cpp/yaml.h>

#include "apps/config/config_reader.hpp"
#include "apps/config/train_config.hpp"

namespace sg::app {

// A config file's size: the largest plausible one (1024 layers written out) is tens of KB; a
// larger file is refused before yaml-cpp parses it (a 14 MB file took seconds to reach the layer bound).
inline constexpr std::uintmax_t kMaxConfigFileBytes = std::uintmax_t{1} << 20;
inline constexpr std::int64_t kMaxModelLayers = 1024;           // model.layers entries, model.sequential layers
inline constexpr std::int64_t kMaxLayerWidth = std::int64_t{1} << 28;  // features of one layer (268,435,456)
inline constexpr double kMaxExampleElements = 2147483648.0;     // one example's values after any layer (2^31)
inline constexpr double kMaxLayerParameters = 1099511627776.0;  // one layer's weights (2^40)
inline constexpr std::int64_t kMaxKernel = 1024;                // conv2d / max_pool2d kernel, stride, padding
inline constexpr std::int64_t kMaxBatch = std::int64_t{1} << 24;  // data.batch_size, data.eval_batch_size

// Throws ConfigError (through `r`, naming the file and line or the --set
// override, and the key) when a size in `c` exceeds a bound above.
void check_plausible_sizes(const ConfigReader& r, const YAML::Node& root, const TrainConfig& c);

}  // namespace sg::app
