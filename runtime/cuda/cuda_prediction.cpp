#include "runtime/cuda/cuda_prediction.hpp"

#include <cstring>
#include <numeric>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/tensor_blob.hpp"

namespace sg::cuda {

std::vector<float> predict_on_cuda(const PredictionProgram& p, const std::vector<io::TensorBlob>& params,
                                   const data::ImageSet& table, const BackendOptions& backend) {
  check_prediction_program(p, table, params);
  if (!device_available()) throw CudaError("no CUDA GPU is available (cudaGetDeviceCount found none)");
  Stream stream;
  LtHandle lt;
  DeviceValues device_params;
  ProgramOptions options;
  options.backend = backend;
  CudaProgram program(p.graph, device_params, lt, options, stream.get());
  const sg::Graph& g = program.graph();
  for (ValueId id : g.values_with_role(Role::param)) {
    const Value& v = g.value(id);
    for (const auto& b : params)
      if (b.name == v.name) {
        const auto bytes = blob_from_floats(v.name, v.shape, v.dtype, floats_from_blob(b)).bytes;
        device_params.at(v.name).upload(bytes.data(), bytes.size());
      }
  }
  program.owned(g.value(p.features).name).upload(table.pixels.data(), table.pixels.size());
  std::vector<std::int32_t> identity(static_cast<std::size_t>(table.count));
  std::iota(identity.begin(), identity.end(), 0);
  program.owned(g.value(p.perm).name).upload(identity.data(), identity.size() * sizeof(std::int32_t));
  const std::int32_t zero = 0;
  program.owned(g.value(p.step).name).upload(&zero, sizeof zero);

  const Value& out = g.value(p.output);
  const auto per_batch = static_cast<std::size_t>(element_count(out.shape));
  std::string bytes(per_batch * dtype_size(out.dtype), '\0');
  std::vector<float> result;
  result.reserve(per_batch * static_cast<std::size_t>(table.count / p.batch));
  for (std::int64_t b = 0; b < table.count / p.batch; ++b) {
    program.record(stream.get());
    stream.synchronize();
    SG_CUDA_CHECK(cudaMemcpy(bytes.data(), program.device_ptr(p.output), bytes.size(), cudaMemcpyDeviceToHost));
    const io::TensorBlob blob{out.name, out.dtype, out.shape, bytes};
    const auto values = floats_from_blob(blob);
    result.insert(result.end(), values.begin(), values.end());
  }
  return result;
}

}  // namespace sg::cuda
