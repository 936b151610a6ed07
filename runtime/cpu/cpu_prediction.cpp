// predict_on_cpu: the prediction graph on the CPU executor, batch by batch.
#include <cstring>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/prediction.hpp"
#include "runtime/tensor_blob.hpp"

namespace sg {

void check_prediction_program(const PredictionProgram& p, const data::ImageSet& table,
                              const std::vector<io::TensorBlob>& params) {
  const Graph& g = p.graph;
  const auto in_range = [&](ValueId id) { return id >= 0 && static_cast<std::size_t>(id) < g.values().size(); };
  if (!in_range(p.features) || !in_range(p.perm) || !in_range(p.step) || !in_range(p.output))
    throw std::invalid_argument("prediction program: a binding is not a value of the graph");
  const Value& f = g.value(p.features);
  if (f.dtype != table.dtype || f.shape != Shape{table.count, table.pixels_per_image()})
    throw std::invalid_argument(fmt::format("prediction program: the feature table is {} {} but the data is {} [{}, {}]",
                                            dtype_name(f.dtype), shape_string(f.shape), dtype_name(table.dtype),
                                            table.count, table.pixels_per_image()));
  if (p.batch <= 0 || table.count % p.batch != 0)
    throw std::invalid_argument(fmt::format("prediction program: batch {} does not divide the {} rows", p.batch,
                                            table.count));
  for (ValueId id : g.values_with_role(Role::param)) {
    const Value& v = g.value(id);
    bool found = false;
    for (const auto& b : params)
      if (b.name == v.name) {
        if (b.shape != v.shape)
          throw std::invalid_argument(fmt::format("parameter '{}' is {} in the checkpoint but {} in the model", v.name,
                                                  shape_string(b.shape), shape_string(v.shape)));
        found = true;
      }
    if (!found) throw std::invalid_argument(fmt::format("the checkpoint has no parameter '{}'", v.name));
  }
}

std::vector<float> predict_on_cpu(const PredictionProgram& p, const std::vector<io::TensorBlob>& params,
                                  const data::ImageSet& table) {
  check_prediction_program(p, table, params);
  CpuExecutor<float> exec(p.graph);
  auto& features = exec.tensor(p.features);
  if (table.dtype == DType::u8) {
    features.u8 = table.pixels;
  } else if (table.dtype == DType::f32) {
    features.real.resize(table.pixels.size() / sizeof(float));
    std::memcpy(features.real.data(), table.pixels.data(), features.real.size() * sizeof(float));
  } else {
    std::vector<std::uint16_t> halves(table.pixels.size() / 2);
    std::memcpy(halves.data(), table.pixels.data(), halves.size() * 2);
    features.real.resize(halves.size());
    for (std::size_t i = 0; i < halves.size(); ++i) features.real[i] = half_bits_to_float(halves[i]);
  }
  auto& perm = exec.tensor(p.perm).i32;
  std::iota(perm.begin(), perm.end(), 0);
  for (const auto& b : params)
    if (auto id = p.graph.find_value(b.name); id && p.graph.value(*id).role == Role::param)
      exec.tensor(*id).real = floats_from_blob(b);
  exec.tensor(p.step).i32[0] = 0;
  std::vector<float> out;
  const auto per_batch = element_count(p.graph.value(p.output).shape);
  out.reserve(static_cast<std::size_t>(per_batch * (table.count / p.batch)));
  for (std::int64_t b = 0; b < table.count / p.batch; ++b) {
    exec.run();
    const auto& y = exec.tensor(p.output).real;
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

}  // namespace sg
