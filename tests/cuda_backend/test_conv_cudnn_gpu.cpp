// Issue 22's cuDNN convolutions against the CPU reference on random shapes:
// conv2d forward (with and without bias, with the relu after it taken into
// the launch), its data gradient and its filter gradient; odd sizes, stride 1
// to 3, padding 0 to 2; NCHW and channels-last activations (issues 36,
// 37); f32 against CpuExecutor<double> and f16 / bf16
// against CpuExecutor<float> (which rounds every value a node writes as the
// GPU stores it). Outputs are poisoned first, so an unwritten element reads
// NaN, and NaN never passes relative_error.
#include <doctest/doctest.h>

#include <random>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

using sg::test::pick;

struct ConvCase {
  std::int64_t n, c, h, w, k, r, s, stride, padding;
  std::int64_t p() const { return (h + 2 * padding - r) / stride + 1; }
  std::int64_t q() const { return (w + 2 * padding - s) / stride + 1; }
};

ConvCase random_case(std::mt19937_64& rng) {
  ConvCase c{};
  c.n = pick(rng, 1, 9);
  c.c = pick(rng, 1, 13);
  c.k = pick(rng, 1, 21);
  c.r = pick(rng, 1, 5);
  c.s = c.r;  // square kernels: the IR's conv2d takes W's last two dims
  c.stride = pick(rng, 1, 3);
  c.padding = pick(rng, 0, 2);
  c.h = pick(rng, std::max<std::int64_t>(1, c.r - 2 * c.padding), 29);
  c.w = pick(rng, std::max<std::int64_t>(1, c.s - 2 * c.padding), 29);
  return c;
}

// Runs `g` on the GPU and on the CPU (T: double for f32, float with dtype
// rounding otherwise) from the same random inputs and parameters, and returns
// the relative error of every output; also the lowering of every launch.
// cuDNN first for every convolution (backend.conv_kernels: cudnn; `auto`
// gives the ones with few channels to our kernels, tests/kernels/test_cnn_kernels.cpp).
cuda::ProgramOptions cudnn_first() {
  cuda::ProgramOptions o;
  o.backend.conv_kernels = ConvKernels::cudnn;
  return o;
}

template <typename T>
std::vector<double> gpu_vs_cpu(const Graph& g, std::mt19937_64& rng, std::vector<std::string>& lowerings,
                               const cuda::ProgramOptions& options = cudnn_first()) {
  cuda::Stream stream;
  cuda::LtHandle lt;
  cuda::DeviceValues params;
  cuda::CudaProgram program(g, params, lt, options, stream.get());
  CpuExecutor<T> cpu(g);
  for (const Value& v : g.values()) {
    if (!is_graph_owned(v.role)) continue;
    std::vector<float> host(static_cast<std::size_t>(element_count(v.shape)));
    sg::test::fill_uniform(host, rng, -1.0, 1.0);
    const auto blob = blob_from_floats(v.name, v.shape, v.dtype, host);
    host = floats_from_blob(blob);  // what the GPU holds
    (v.role == Role::param ? params.at(v.name) : program.owned(v.name)).upload(blob.bytes.data(), blob.bytes.size());
    cpu.tensor(v.id).real.assign(host.begin(), host.end());
  }
  program.poison_arena(stream.get());
  program.record(stream.get());
  stream.synchronize();
  cpu.run();
  for (const Launch& l : program.schedule().launches) lowerings.emplace_back(l.lowering->name());
  std::vector<double> errors;
  for (ValueId out : g.outputs()) {
    const Value& v = g.value(out);
    io::TensorBlob blob{v.name, v.dtype, v.shape,
                        std::string(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype), '\0')};
    SG_CUDA_CHECK(cudaMemcpy(blob.bytes.data(), program.device_ptr(out), blob.bytes.size(), cudaMemcpyDeviceToHost));
    const auto& expected = cpu.tensor(out).real;
    errors.push_back(sg::test::relative_error(floats_from_blob(blob), std::vector<double>(expected.begin(), expected.end())));
  }
  return errors;
}

// f32 sums the same products in another order; f16/bf16 outputs are rounded
// once more than the CPU's (cuDNN rounds the fp32 accumulator, the CPU
// reference rounds the same sum taken in float).
double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : dtype == DType::f16 ? 2e-3 : 1.6e-2; }

std::vector<double> run_case(const Graph& g, DType dtype, std::mt19937_64& rng, std::vector<std::string>& lowerings,
                             const cuda::ProgramOptions& options = cudnn_first()) {
  return dtype == DType::f32 ? gpu_vs_cpu<double>(g, rng, lowerings, options)
                             : gpu_vs_cpu<float>(g, rng, lowerings, options);
}

}  // namespace

TEST_CASE("cuDNN conv2d forward (bias, relu), backward data and backward filter match the CPU reference") {
  auto rng = sg::test::fresh_rng();
  for (int trial = 0; trial < 10; ++trial)
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (const bool last : {false, true}) {  // NCHW, or channels-last activations ([N,H,W,C])
        const ConvCase c = random_case(rng);
        CAPTURE(sg::test::last_seed());
        CAPTURE(dtype_name(dtype));
        CAPTURE(last);
        CAPTURE(fmt::format("x {}x{}x{}x{} w {}x{}x{}x{} stride {} padding {}", c.n, c.c, c.h, c.w, c.k, c.c, c.r, c.s,
                            c.stride, c.padding));
        const auto activation = [&](std::int64_t ch, std::int64_t h, std::int64_t w) {
          return last ? Shape{c.n, h, w, ch} : Shape{c.n, ch, h, w};
        };
        const Conv2dAttrs forward{c.stride, c.padding, 0, 0, last};
        // 0: forward; 1: forward + bias; 2: forward + bias + relu (one launch).
        for (int variant = 0; variant < 3; ++variant) {
          CAPTURE(variant);
          Graph g;
          const ValueId x = g.input("x", activation(c.c, c.h, c.w), dtype);
          const ValueId w = g.param("w", {c.k, c.c, c.r, c.s}, dtype);
          std::vector<ValueId> inputs{x, w};
          if (variant >= 1) inputs.push_back(g.param("b", {c.k}, dtype));
          ValueId y = g.append_node(OpKind::conv2d, inputs, forward).front();
          if (variant == 2) y = g.relu(y);
          g.mark_output(y);
          std::vector<std::string> lowerings;
          const auto errors = run_case(g, dtype, rng, lowerings);
          CHECK(lowerings == std::vector<std::string>{"conv_cudnn"});
          CHECK(errors.at(0) < tolerance(dtype));
        }
        {  // dX = conv2d_backward_data(dY, W)
          Graph g;
          const ValueId dy = g.input("dy", activation(c.k, c.p(), c.q()), dtype);
          const ValueId w = g.param("w", {c.k, c.c, c.r, c.s}, dtype);
          const Conv2dAttrs data{c.stride, c.padding, c.h, c.w, last};
          g.mark_output(g.append_node(OpKind::conv2d_backward_data, {dy, w}, data).front());
          std::vector<std::string> lowerings;
          const auto errors = run_case(g, dtype, rng, lowerings);
          CHECK(lowerings == std::vector<std::string>{"conv_cudnn"});
          CHECK(errors.at(0) < tolerance(dtype));
        }
        {  // dW = conv2d_backward_filter(dY, X): sums over N x P x Q terms
          Graph g;
          const ValueId dy = g.input("dy", activation(c.k, c.p(), c.q()), dtype);
          const ValueId x = g.input("x", activation(c.c, c.h, c.w), dtype);
          const Conv2dAttrs filter{c.stride, c.padding, c.r, c.s, last};
          g.mark_output(g.append_node(OpKind::conv2d_backward_filter, {dy, x}, filter).front());
          std::vector<std::string> lowerings;
          const auto errors = run_case(g, dtype, rng, lowerings);
          CHECK(lowerings == std::vector<std::string>{"conv_cudnn"});
          CHECK(errors.at(0) < tolerance(dtype));
        }
      }
}

TEST_CASE("reshape and flatten are views: no kernel, the output shares its input's buffer") {
  auto rng = sg::test::fresh_rng();
  Graph g;
  const ValueId x = g.input("x", {4, 3, 5, 5}, DType::f32);
  const ValueId w = g.param("w", {6, 3, 3, 3}, DType::f32);
  const ValueId y = g.append_node(OpKind::conv2d, {x, w}, Conv2dAttrs{1, 1, 0, 0}).front();
  const ValueId flat = g.flatten(y);
  const ValueId back = g.reshape(flat, {4, 6, 5, 5});
  g.mark_output(g.relu(back));
  cuda::Stream stream;
  cuda::LtHandle lt;
  cuda::DeviceValues params;
  const cuda::CudaProgram program(g, params, lt, cudnn_first(), stream.get());
  std::vector<std::string> names;
  for (const Launch& l : program.schedule().launches) names.emplace_back(l.lowering->name());
  CHECK(names == std::vector<std::string>{"conv_cudnn", "view", "view", "elementwise"});
  CHECK(program.device_ptr(flat) == program.device_ptr(y));
  CHECK(program.device_ptr(back) == program.device_ptr(y));
  std::vector<std::string> lowerings;
  const auto errors = run_case(g, DType::f32, rng, lowerings);
  CHECK(errors.at(0) < 1e-5);
}

// backend.cudnn_knob_variants: autotune also times engines with one knob moved
// (split-K, tiles, stages) and takes a variant only after three identical
// runs; whatever it picks must still be the convolution.
TEST_CASE("cuDNN convolutions autotuned with knob variants match the CPU reference") {
  auto rng = sg::test::fresh_rng();
  cuda::ProgramOptions o = cudnn_first();
  o.backend.autotune = true;
  o.backend.cudnn_knob_variants = 64;
  for (const DType dtype : {DType::f32, DType::f16}) {
    // A CNN's 3x3 layer (a long filter-gradient reduction: 32 x 14 x 14 terms) and a random small one.
    for (const ConvCase& c : {ConvCase{32, 32, 14, 14, 32, 3, 3, 1, 1}, random_case(rng)}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(fmt::format("x {}x{}x{}x{} w {}x{}x{}x{} stride {} padding {}", c.n, c.c, c.h, c.w, c.k, c.c, c.r, c.s,
                          c.stride, c.padding));
      const Shape x_shape{c.n, c.h, c.w, c.c}, y_shape{c.n, c.p(), c.q(), c.k};  // channels-last
      for (const OpKind op : {OpKind::conv2d, OpKind::conv2d_backward_data, OpKind::conv2d_backward_filter}) {
        CAPTURE(op_name(op));
        Graph g;
        if (op == OpKind::conv2d) {
          const ValueId x = g.input("x", x_shape, dtype), w = g.param("w", {c.k, c.c, c.r, c.s}, dtype);
          g.mark_output(g.append_node(op, {x, w}, Conv2dAttrs{c.stride, c.padding, 0, 0, true}).front());
        } else if (op == OpKind::conv2d_backward_data) {
          const ValueId dy = g.input("dy", y_shape, dtype), w = g.param("w", {c.k, c.c, c.r, c.s}, dtype);
          g.mark_output(g.append_node(op, {dy, w}, Conv2dAttrs{c.stride, c.padding, c.h, c.w, true}).front());
        } else {
          const ValueId dy = g.input("dy", y_shape, dtype), x = g.input("x", x_shape, dtype);
          g.mark_output(g.append_node(op, {dy, x}, Conv2dAttrs{c.stride, c.padding, c.r, c.s, true}).front());
        }
        std::vector<std::string> lowerings;
        const auto errors = run_case(g, dtype, rng, lowerings, o);
        CHECK(lowerings == std::vector<std::string>{"conv_cudnn"});
        CHECK(errors.at(0) < tolerance(dtype));
      }
    }
  }
}
