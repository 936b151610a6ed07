#pragma once
// Small pieces the lowerings share: dtype dispatch, matmul operand shapes,
// unit queries, and a recorded launch made of a bound closure.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <fmt/format.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/cuda/cublaslt_matmul.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dropout.hpp"
#include "runtime/cuda/lowering.hpp"

namespace sg::cuda {

// A launch whose buffers are bound into `enqueue_`.
// `parameters_written` (optional): what rebuilds the launch's state derived
// from the parameters after the host wrote them (carried compute copies).
class BoundLaunch final : public RecordedLaunch {
 public:
  explicit BoundLaunch(std::function<void(cudaStream_t)> enqueue, std::string label = {},
                       std::function<void(cudaStream_t)> parameters_written = {})
      : enqueue_(std::move(enqueue)), label_(std::move(label)), parameters_written_(std::move(parameters_written)) {}
  void enqueue(cudaStream_t stream) const override { enqueue_(stream); }
  void parameters_written(cudaStream_t stream) const override {
    if (parameters_written_) parameters_written_(stream);
  }
  std::string label() const override { return label_; }

 private:
  std::function<void(cudaStream_t)> enqueue_;
  std::string label_;
  std::function<void(cudaStream_t)> parameters_written_;
};

// Calls f with a value of the element type of `dtype` (__half, __nv_bfloat16
// or float): every kernel it reaches is instantiated for all three.
template <typename F>
void with_float_type(DType dtype, F&& f) {
  if (dtype == DType::f16) f(__half{});
  else if (dtype == DType::bf16) f(__nv_bfloat16{});
  else if (dtype == DType::f32) f(float{});
  else throw CudaError(fmt::format("cuda backend: {} is not a floating dtype", dtype_name(dtype)));
}

// cuBLASLt element type of a matmul operand (nullopt for other dtypes).
std::optional<ElemType> elem_type(DType dtype);

// A matmul node's operand sizes, transposes and input type (the caller sets
// the output type, accumulation and epilogue).
MatmulShape operand_shape(const sg::Graph& g, const Node& matmul);

// The shape of a forward matmul node (fp32 accumulation).
MatmulShape forward_shape(const sg::Graph& g, NodeId matmul, Epilogue epilogue, DType out);

// Inner (summed) dimension of a matmul node.
std::int64_t inner_dim(const sg::Graph& g, const Node& matmul);

// Nodes of a unit by op (the first of that op; -1 when none).
NodeId node_of(const sg::Graph& g, const CoverUnit& unit, OpKind op);

// Whether `sgd` is a plain SGD update (no velocity state).
bool plain_sgd(const Node& sgd);

// The free unit whose nodes are exactly a bias-gradient SGD group summing
// `grad` with plain SGD (no cast, no velocity), if any.
const CoverUnit* free_plain_bias_update_of(const Cover& cover, ValueId grad);

// The wgrad_sgd unit updating `weight` from a matmul that reads `dy` first
// (plain SGD when `plain`), if free.
const CoverUnit* free_weight_update(const Cover& cover, ValueId dy, ValueId weight, bool plain);

// The dropout kernels' parameters of a dropout / dropout2d node (and their backwards).
DropoutParams dropout_params_of(const DropoutAttrs& a);

// The one element of a match: the offered unit alone.
Match single_unit(const CoverUnit& unit);

// The working-copy dtype (f16 / bf16) when `n` casts an fp32 parameter to it (the casts fp32 master weights
// get), else nothing.
std::optional<DType> param_cast_to(const sg::Graph& g, const Node& n);

// A whole-step kernel's phase profile (RecordedLaunch::profile_phases): runs
// `step(clock)` `repeats` times, each storing GPU-clock nanoseconds at its
// start and after each phase into `clock` (names.size() + 1 entries), and
// returns the median microseconds of each gap under its name.
std::vector<std::pair<std::string, double>> median_phase_times(
    const std::vector<std::string>& names, int repeats, cudaStream_t stream,
    const std::function<void(unsigned long long* clock)>& step);

}  // namespace sg::cuda
