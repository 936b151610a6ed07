// Our implicit-GEMM convolutions (ops/cuda/conv_implicit_gemm.cu,
// conv_direct.cu) against the CPU reference: forward (+bias, +relu), backward
// data and backward filter on random shapes and the shipped CNNs' layers,
// recorded through their lowering directly (it is not in cuda_lowerings()
// alone). Outputs are poisoned first; NaN never passes relative_error.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

using sg::test::pick;

const std::vector<DType> kDtypes = {DType::f32, DType::f16, DType::bf16};

// ---- The implicit-GEMM convolutions (not in cuda_lowerings(): built directly here)

namespace sg::cuda {
std::unique_ptr<CudaLowering> make_conv_implicit_gemm_lowering(std::int64_t max_channel_product);
}  // namespace sg::cuda

namespace {

// A binding of every graph value to a buffer of its own: what one lowering
// needs to record its launches outside a CudaProgram.
class DirectBinding final : public cuda::BindContext {
 public:
  DirectBinding(const Graph& g, const Schedule& s) : g_(g), s_(s) {
    for (const Value& v : g.values())
      buffers_.emplace_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
  }
  const Graph& graph() const override { return g_; }
  const Schedule& schedule() const override { return s_; }
  const BackendOptions& options() const override { return options_; }
  const cuda::LtHandle& lt() const override { return lt_; }
  cudaStream_t stream() const override { return stream_.get(); }
  void* ptr(ValueId id) const override { return buffers_.at(static_cast<std::size_t>(id)).data(); }
  void* aux(int) const override { throw std::logic_error("no relu masks here"); }
  const cuda::UpdateScalars* update_scalars(NodeId) const override { throw std::logic_error("no updates here"); }
  const void* one(bool) const override { throw std::logic_error("no cuBLASLt here"); }
  const void* zero(bool) const override { throw std::logic_error("no cuBLASLt here"); }
  float* scratch_float() const override { throw std::logic_error("no scratch here"); }
  const cuda::cudnn::Handle& cudnn() const override { throw std::logic_error("no cuDNN here"); }
  void* const* workspace(std::size_t bytes) const override {
    workspace_bytes_ = std::max(workspace_bytes_, bytes);
    return &workspace_ptr_;
  }
  // After every launch is recorded: the workspace they asked for.
  void allocate_workspace() {
    workspace_ = cuda::DeviceBuffer(workspace_bytes_);
    workspace_ptr_ = workspace_.data();
  }
  cuda::DeviceBuffer& buffer(ValueId id) { return buffers_.at(static_cast<std::size_t>(id)); }
  cudaStream_t stream_handle() const { return stream_.get(); }

 private:
  const Graph& g_;
  const Schedule& s_;
  BackendOptions options_;
  cuda::LtHandle lt_;
  cuda::Stream stream_;
  std::vector<cuda::DeviceBuffer> buffers_;
  mutable std::size_t workspace_bytes_ = 0;
  cuda::DeviceBuffer workspace_;
  void* workspace_ptr_ = nullptr;
};

struct ConvCase {
  std::int64_t n, c, h, w, o, k, stride, padding;
  std::int64_t oh() const { return (h + 2 * padding - k) / stride + 1; }
  std::int64_t ow() const { return (w + 2 * padding - k) / stride + 1; }
};

ConvCase random_conv_case(std::mt19937_64& rng) {
  ConvCase c{};
  c.k = pick(rng, 1, 5);
  c.stride = pick(rng, 1, 3);
  c.padding = pick(rng, 0, 2);
  c.n = pick(rng, 1, 5);
  c.c = pick(rng, 1, 7);
  c.o = pick(rng, 1, 12);
  c.h = std::max<std::int64_t>(1, c.k - 2 * c.padding) + pick(rng, 0, 15);
  c.w = std::max<std::int64_t>(1, c.k - 2 * c.padding) + pick(rng, 0, 15);
  return c;
}

// The three passes of one convolution (the forward with bias [+ relu]) by
// the implicit-GEMM lowering and by the CPU reference.
void check_implicit_gemm(const ConvCase& cc, DType dtype, bool relu, bool with_bias, std::mt19937_64& rng) {
  CAPTURE(fmt::format("{} n{} c{} {}x{} o{} k{} stride {} padding {} relu {} bias {}", dtype_name(dtype), cc.n, cc.c,
                      cc.h, cc.w, cc.o, cc.k, cc.stride, cc.padding, relu, with_bias));
  Graph g;
  const ValueId x = g.input("x", {cc.n, cc.c, cc.h, cc.w}, dtype);
  const ValueId w = g.input("w", {cc.o, cc.c, cc.k, cc.k}, dtype);
  const ValueId bias = g.input("bias", {cc.o}, dtype);
  const ValueId dy = g.input("dy", {cc.n, cc.o, cc.oh(), cc.ow()}, dtype);
  ValueId y = g.conv2d(x, w, with_bias ? std::optional<ValueId>(bias) : std::nullopt, static_cast<int>(cc.stride),
                       static_cast<int>(cc.padding));
  if (relu) y = g.append_node(OpKind::relu, {y}, NoAttrs{}).front();
  const ValueId dx =
      g.append_node(OpKind::conv2d_backward_data, {dy, w}, Conv2dAttrs{cc.stride, cc.padding, cc.h, cc.w}).front();
  const ValueId dw =
      g.append_node(OpKind::conv2d_backward_filter, {dy, x}, Conv2dAttrs{cc.stride, cc.padding, cc.k, cc.k}).front();
  for (ValueId v : {y, dx, dw}) g.mark_output(v);

  const auto lowering = cuda::make_conv_implicit_gemm_lowering(0);
  const Schedule s = build_schedule(g, {lowering.get()});
  REQUIRE(s.launches.size() == 3);
  DirectBinding binding(g, s);
  CpuExecutor<float> cpu(g);
  for (ValueId in : {x, w, bias, dy}) {
    const Value& v = g.value(in);
    std::vector<float> host(static_cast<std::size_t>(element_count(v.shape)));
    sg::test::fill_uniform(host, rng, -1.0, 1.0);
    const auto blob = blob_from_floats(v.name, v.shape, v.dtype, host);
    binding.buffer(in).upload(blob.bytes.data(), blob.bytes.size());
    host = floats_from_blob(blob);
    cpu.tensor(in).real.assign(host.begin(), host.end());
  }
  for (ValueId out : {y, dx, dw}) binding.buffer(out).fill_bytes(0xff);  // NaN until written
  std::vector<std::unique_ptr<cuda::RecordedLaunch>> launches;
  for (std::size_t i = 0; i < s.launches.size(); ++i)
    launches.push_back(cuda::cuda_lowering_of(s.launches[i]).record(s.launches[i], i, binding));
  binding.allocate_workspace();
  for (const auto& l : launches) l->enqueue(binding.stream_handle());
  SG_CUDA_CHECK(cudaStreamSynchronize(binding.stream_handle()));
  cpu.run();
  // f32: sums of up to 36864 products in another order (tiles, split K) than
  // the reference's one-by-one float sum.
  const double tolerance = dtype == DType::f32 ? 1e-4 : dtype == DType::f16 ? 2e-3 : 1e-2;
  std::vector<std::string> first_bits;
  for (ValueId out : {y, dx, dw}) {
    const Value& v = g.value(out);
    CAPTURE(v.name);
    io::TensorBlob blob{v.name, v.dtype, v.shape,
                        std::string(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype), '\0')};
    binding.buffer(out).download(blob.bytes.data(), blob.bytes.size());
    CHECK(sg::test::relative_error(floats_from_blob(blob), cpu.tensor(out).real) < tolerance);
    first_bits.push_back(std::move(blob.bytes));
  }
  // A replay gives the same bits (the partial sums are added in a fixed order).
  for (ValueId out : {y, dx, dw}) binding.buffer(out).fill_bytes(0xff);
  for (const auto& l : launches) l->enqueue(binding.stream_handle());
  SG_CUDA_CHECK(cudaStreamSynchronize(binding.stream_handle()));
  std::size_t i = 0;
  for (ValueId out : {y, dx, dw}) {
    std::string bits(first_bits[i].size(), '\0');
    binding.buffer(out).download(bits.data(), bits.size());
    CHECK_MESSAGE(bits == first_bits[i], g.value(out).name, " differs on replay");
    ++i;
  }
}

}  // namespace

TEST_CASE("implicit-GEMM conv forward (+bias, +relu), backward data and backward filter match the CPU reference") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for (int trial = 0; trial < 10; ++trial)
    for (const DType dtype : kDtypes)
      check_implicit_gemm(random_conv_case(rng), dtype, trial % 2 == 1, trial % 3 != 0, rng);
  // The MNIST CNN's two convolutions at batch 64 (both dtypes, relu and
  // not) and at batch 256 (many ordered weight-gradient partials), the fast
  // config's two at batch 128 (padding 2, 32 and 64 channels), and images
  // too large for the direct path's shared memory (the tiled GEMM forward and
  // weight gradient, split K) with a 3 x 3 and a 4 x 4 filter, or in
  // chunks of input channels (99 = 50 + 49; the fast config's dgrad too).
  for (const ConvCase& cc : {ConvCase{64, 1, 28, 28, 10, 5, 1, 0}, ConvCase{64, 10, 12, 12, 20, 5, 1, 0}}) {
    check_implicit_gemm(cc, DType::f16, false, true, rng);
    check_implicit_gemm(cc, DType::f32, true, true, rng);
  }
  for (const ConvCase& cc : {ConvCase{256, 10, 12, 12, 20, 5, 1, 0}, ConvCase{128, 1, 28, 28, 32, 5, 1, 2},
                             ConvCase{128, 32, 14, 14, 64, 5, 1, 2}, ConvCase{2, 40, 30, 30, 6, 3, 1, 1},
                             ConvCase{3, 30, 33, 31, 5, 4, 1, 0}, ConvCase{2, 99, 15, 15, 12, 5, 1, 2}})
    check_implicit_gemm(cc, DType::f16, true, true, rng);
}
