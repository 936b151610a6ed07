// Our implicit-GEMM convolutions (ops/cuda/conv_implicit_gemm.cu,
// conv_direct.cu) against the CPU reference: forward (+bias, +relu), backward
// data and backward filter on random shapes and the shipped CNNs' layers,
// recorded through their lowering directly (it is not in cuda_lowerings()
// alone). Outputs are poisoned first; NaN never passes relative_error. A
// bias gradient folded into the direct weight gradient (conv_wgrad_bias) too.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "ops/cuda/conv_implicit_gemm.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

using sg::test::pick;

const std::vector<DType> kDtypes = {DType::f32, DType::f16, DType::bf16};

// ---- The implicit-GEMM convolutions (not in cuda_lowerings(): built directly here)

namespace sg::cuda {
std::unique_ptr<CudaLowering> make_conv_implicit_gemm_lowering(std::int64_t max_channel_product);
std::unique_ptr<CudaLowering> make_conv_wgrad_bias_lowering(std::int64_t max_channel_product);
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

// f32: sums of up to 36864 products in another order (tiles, split K,
// partials) than the reference's one-by-one float sum.
double tolerance_of(DType dtype) { return dtype == DType::f32 ? 1e-4 : dtype == DType::f16 ? 2e-3 : 1e-2; }

// Records the schedule's launches through DirectBinding, runs them on random
// inputs (outputs poisoned first: NaN until written) and compares `outputs`
// with the CPU reference's; a second run gives the same bits (the partial
// sums are added in a fixed order).
void run_against_cpu(const Graph& g, const Schedule& s, const std::vector<ValueId>& inputs,
                     const std::vector<ValueId>& outputs, double tolerance, std::mt19937_64& rng) {
  DirectBinding binding(g, s);
  CpuExecutor<float> cpu(g);
  for (ValueId in : inputs) {
    const Value& v = g.value(in);
    std::vector<float> host(static_cast<std::size_t>(element_count(v.shape)));
    sg::test::fill_uniform(host, rng, -1.0, 1.0);
    const auto blob = blob_from_floats(v.name, v.shape, v.dtype, host);
    binding.buffer(in).upload(blob.bytes.data(), blob.bytes.size());
    host = floats_from_blob(blob);
    cpu.tensor(in).real.assign(host.begin(), host.end());
  }
  for (ValueId out : outputs) binding.buffer(out).fill_bytes(0xff);
  std::vector<std::unique_ptr<cuda::RecordedLaunch>> launches;
  for (std::size_t i = 0; i < s.launches.size(); ++i)
    launches.push_back(cuda::cuda_lowering_of(s.launches[i]).record(s.launches[i], i, binding));
  binding.allocate_workspace();
  for (const auto& l : launches) l->enqueue(binding.stream_handle());
  SG_CUDA_CHECK(cudaStreamSynchronize(binding.stream_handle()));
  cpu.run();
  std::vector<std::string> first_bits;
  for (ValueId out : outputs) {
    const Value& v = g.value(out);
    CAPTURE(v.name);
    io::TensorBlob blob{v.name, v.dtype, v.shape,
                        std::string(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype), '\0')};
    binding.buffer(out).download(blob.bytes.data(), blob.bytes.size());
    CHECK(sg::test::relative_error(floats_from_blob(blob), cpu.tensor(out).real) < tolerance);
    first_bits.push_back(std::move(blob.bytes));
  }
  for (ValueId out : outputs) binding.buffer(out).fill_bytes(0xff);
  for (const auto& l : launches) l->enqueue(binding.stream_handle());
  SG_CUDA_CHECK(cudaStreamSynchronize(binding.stream_handle()));
  std::size_t i = 0;
  for (ValueId out : outputs) {
    std::string bits(first_bits[i].size(), '\0');
    binding.buffer(out).download(bits.data(), bits.size());
    CHECK_MESSAGE(bits == first_bits[i], g.value(out).name, " differs on replay");
    ++i;
  }
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
  run_against_cpu(g, s, {x, w, bias, dy}, {y, dx, dw}, tolerance_of(dtype), rng);
}

// The reshape of dY (a graph input here, which the view lowering leaves to
// its owner) as a launch that does nothing: the fold reads dY itself.
class UnreadView final : public cuda::CudaLowering {
 public:
  std::string_view name() const override { return "unread_view"; }
  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (cover.graph().node(unit.nodes.front()).op != OpKind::reshape) return std::nullopt;
    Match m;
    m.units = {unit.id};
    return m;
  }
  std::string describe(const Graph&, const Launch&) const override { return ""; }
  std::unique_ptr<cuda::RecordedLaunch> record(const Launch&, std::size_t, const cuda::BindContext&) const override {
    return std::make_unique<cuda::BoundLaunch>([](cudaStream_t) {}, "no kernel");
  }
};

// A weight gradient with its bias's gradient (channel_sum of NCHW dY, or
// reduce_rows of channels-last dY seen as [N*H*W, O] for one input channel)
// [and the sums' cast to f32] as ONE conv_wgrad_bias launch.
void check_wgrad_bias(const ConvCase& cc, DType dtype, bool channels_last, bool widened, std::mt19937_64& rng) {
  CAPTURE(fmt::format("{} n{} c{} {}x{} o{} k{} stride {} padding {} channels-last {} widened {}", dtype_name(dtype),
                      cc.n, cc.c, cc.h, cc.w, cc.o, cc.k, cc.stride, cc.padding, channels_last, widened));
  Graph g;
  const ValueId x = channels_last ? g.input("x", {cc.n, cc.h, cc.w, cc.c}, dtype)
                                  : g.input("x", {cc.n, cc.c, cc.h, cc.w}, dtype);
  const ValueId dy = channels_last ? g.input("dy", {cc.n, cc.oh(), cc.ow(), cc.o}, dtype)
                                   : g.input("dy", {cc.n, cc.o, cc.oh(), cc.ow()}, dtype);
  const ValueId dw = g.append_node(OpKind::conv2d_backward_filter, {dy, x},
                                   Conv2dAttrs{cc.stride, cc.padding, cc.k, cc.k, channels_last})
                         .front();
  ValueId db = channels_last ? g.append_node(OpKind::reduce_rows, {g.reshape(dy, {cc.n * cc.oh() * cc.ow(), cc.o})},
                                             NoAttrs{})
                                   .front()
                             : g.append_node(OpKind::channel_sum, {dy}, NoAttrs{}).front();
  if (widened) db = g.append_node(OpKind::cast, {db}, CastAttrs{DType::f32}).front();
  for (ValueId v : {dw, db}) g.mark_output(v);
  const auto fold = cuda::make_conv_wgrad_bias_lowering(0);
  const auto conv = cuda::make_conv_implicit_gemm_lowering(0);
  const UnreadView view;
  const Schedule s = build_schedule(g, {fold.get(), conv.get(), &view});
  const auto is_fold = [](const Launch& l) { return l.lowering->name() == "conv_wgrad_bias"; };
  REQUIRE(std::count_if(s.launches.begin(), s.launches.end(), is_fold) == 1);
  const Launch& l = *std::find_if(s.launches.begin(), s.launches.end(), is_fold);
  CHECK(l.nodes.size() == (widened ? 3u : 2u));
  run_against_cpu(g, s, {x, dy}, {dw, db}, tolerance_of(dtype), rng);
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

TEST_CASE("a conv bias's gradient rides in the direct weight gradient's pass (conv_wgrad_bias) and matches the CPU") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  // Random NCHW shapes (those whose direct plan fits), and one input channel channels-last.
  int folded = 0;
  for (int trial = 0; folded < 12 && trial < 100; ++trial) {
    const ConvCase cc = random_conv_case(rng);
    if (cc.n * cc.c * cc.h * cc.w > 20000) continue;
    for (const bool channels_last : {false, true}) {
      ConvCase one = cc;
      if (channels_last) one.c = 1;
      // Widened to f32: the f16 / bf16 sums only (an f32 sum has no cast).
      const DType dtype = kDtypes[std::size_t(trial) % kDtypes.size()];
      check_wgrad_bias(one, dtype, channels_last, trial % 2 == 1 && dtype != DType::f32, rng);
    }
    ++folded;
  }
  // mnist_cnn_fast's first layer at batch 128 (both layouts; f16, widened and not) and the report CNN's two.
  for (const bool channels_last : {false, true})
    for (const bool widened : {false, true})
      check_wgrad_bias(ConvCase{128, 1, 28, 28, 32, 5, 1, 2}, DType::f16, channels_last, widened, rng);
  check_wgrad_bias(ConvCase{64, 1, 28, 28, 10, 5, 1, 0}, DType::f16, false, true, rng);
  check_wgrad_bias(ConvCase{64, 10, 12, 12, 20, 5, 1, 0}, DType::bf16, false, false, rng);
  // Channels-last dY read 16 bytes at a time with a channel tile half empty
  // (24 of 32), stride 2, in bf16; and an image split over pixel ranges.
  check_wgrad_bias(ConvCase{5, 1, 17, 13, 24, 3, 2, 1}, DType::bf16, true, true, rng);
  check_wgrad_bias(ConvCase{2, 1, 40, 36, 16, 5, 1, 2}, DType::f16, true, false, rng);
}

TEST_CASE("the direct weight gradient of few-channel layers runs on tensor cores in f16 and bf16") {
  // The plans of the shipped CNNs' first layers (132 multiprocessors, as an
  // H100 / H200): the tensor-core kernel, its blocks covering every pixel.
  for (const cuda::ConvShape& shape : {cuda::ConvShape{128, 1, 28, 28, 32, 5, 5, 1, 2, true},
                                       cuda::ConvShape{128, 1, 28, 28, 32, 5, 5, 1, 2, false},
                                       cuda::ConvShape{64, 1, 28, 28, 10, 5, 5, 1, 0, false},
                                       cuda::ConvShape{256, 3, 32, 32, 16, 3, 3, 1, 1, false}}) {
    CAPTURE(fmt::format("n{} c{} {}x{} o{} k{}", shape.n, shape.c, shape.h, shape.w, shape.o, shape.kh));
    const cuda::ImplicitGemmPlan plan =
        cuda::plan_implicit_gemm(cuda::ConvPass::backward_filter, shape, 132, true, true);
    REQUIRE(plan.direct);
    CHECK(plan.mma.usable);
    CHECK(plan.mma.ranges * plan.mma.range_pixels >= shape.oh() * shape.ow());
    CHECK((plan.mma.ranges - 1) * plan.mma.range_pixels < shape.oh() * shape.ow());
    CHECK(cuda::describe_plan(plan).find("tensor cores") != std::string::npos);
  }
  // Too many (channel, column) tiles (64 x 1600: 102 tile groups, more
  // than 8 blocks of 8 warps): the SIMT kernel alone.
  const cuda::ImplicitGemmPlan wide =
      cuda::plan_implicit_gemm(cuda::ConvPass::backward_filter, {8, 64, 8, 8, 64, 5, 5, 1, 2, false}, 132);
  REQUIRE(wide.direct);
  CHECK_FALSE(wide.mma.usable);
}
