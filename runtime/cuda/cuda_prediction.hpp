#pragma once
// predict_on_cuda: the prediction graph lowered by the training lowerings
// (runtime/cuda/cuda_program.hpp), run once per batch on the GPU; outputs
// are read back and widened to f32.
#include <vector>

#include "runtime/backend_options.hpp"
#include "runtime/prediction.hpp"

namespace sg::cuda {

// Same contract as sg::predict_on_cpu. Throws CudaError without a GPU.
std::vector<float> predict_on_cuda(const PredictionProgram& p, const std::vector<io::TensorBlob>& params,
                                   const data::ImageSet& table, const BackendOptions& backend);

}  // namespace sg::cuda
