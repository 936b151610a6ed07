// The max-pool kernels' packed paths (ops/cuda/pooling.cu): windows that
// tile the plane, 2x2 and 3x3, one thread per 1, 2 or 4 windows of a row,
// rows read and written in packs of 4, 8 or 16 bytes where the plane's width
// and the pointers allow, element by element where not. Through the CUDA
// program against the CPU reference (TwinRun) on chosen plane widths: 28 and
// 14 (the MNIST CNNs'), widths whose rows are 16-, 8- or only 4-byte aligned,
// widths with an odd number of windows, 3x3 windows whose rows cannot be
// packed in f16 / bf16, and widths that do not tile (the generic kernels);
// each with and without dropout2d, in f32, f16 and bf16; bit for bit. Then
// the launchers called directly on tensors offset from their allocation's
// alignment (a planned buffer's offset is always aligned, so only a direct
// call reaches these): the same bits as the aligned launch.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/pooling.hpp"
#include "ops/philox.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/kernels/twin_run.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using sg::test::Fill;
using sg::test::pick;
using sg::test::TwinRun;
using sg::test::with_type;

namespace {

const std::vector<DType> kDtypes = {DType::f32, DType::f16, DType::bf16};

// A square window (kernel == stride) over an h x w plane.
struct Window {
  std::int64_t kernel, h, w;
};

// Tiling 2x2: rows of 28 f16 (56 bytes: 8-byte packs, 2 windows a thread),
// 14 (7 windows: 1 a thread, 4-byte packs), 16 (4 windows, 16-byte packs),
// 6 and 10 (an odd number of windows), 2 (one window); 3x3: 12 (4 windows,
// 8-byte packs in f16), 6 (2 windows, 4-byte packs), 9 and 3 (odd: element by
// element in f16 / bf16). Not tiling (generic kernels): 7, 5 x 9, 3x3 over 10.
const std::vector<Window> kWindows = {{2, 28, 28}, {2, 14, 14}, {2, 16, 16}, {2, 6, 6},  {2, 10, 10},
                                      {2, 4, 2},   {3, 12, 12}, {3, 6, 6},   {3, 9, 9},  {3, 3, 3},
                                      {3, 6, 12},  {2, 7, 7},   {2, 5, 9},   {3, 10, 10}};

Shape pooled_shape(const Shape& x, const Window& win) {
  return {x[0], x[1], (x[2] - win.kernel) / win.kernel + 1, (x[3] - win.kernel) / win.kernel + 1};
}

}  // namespace

TEST_CASE("max_pool2d forward on windows that tile the plane (packed rows) matches the CPU bit for bit") {
  auto rng = sg::test::fresh_rng();
  for (std::size_t wi = 0; wi < kWindows.size(); ++wi)
    for (const DType dtype : kDtypes) {
      const Window win = kWindows[wi];
      const Shape x_shape{pick(rng, 1, 6), pick(rng, 1, 9), win.h, win.w};
      const Pool2dAttrs pool{win.kernel, win.kernel};
      const DropoutAttrs dropout{0.5, rng(), 3};
      const std::int32_t step = static_cast<std::int32_t>(pick(rng, 0, 5000));
      const Fill fill{wi % 2 == 0};
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {} kernel {} step {} ties {}", dtype_name(dtype), fmt::join(x_shape, "x"),
                          win.kernel, step, fill.ties));
      // 0: pool alone; 1: pool + relu; 2: dropout2d + pool + relu, only the
      // relu read after; 3: the same with the dropout2d and pool outputs read too.
      for (int variant = 0; variant < 4; ++variant) {
        CAPTURE(variant);
        Graph g;
        const ValueId x = g.input("x", x_shape, dtype);
        ValueId in = x, dropped = -1;
        if (variant >= 2) {
          const ValueId s = g.state("step", {1}, DType::i32);
          in = dropped = g.append_node(OpKind::dropout2d, {x, s}, dropout).front();
        }
        const ValueId pooled = g.append_node(OpKind::max_pool2d, {in}, pool).front();
        const ValueId relu = variant >= 1 ? g.append_node(OpKind::relu, {pooled}, NoAttrs{}).front() : -1;
        std::vector<ValueId> checked = {variant == 0 ? pooled : relu};
        if (variant == 3) checked = {dropped, pooled, relu};
        for (ValueId v : checked) g.mark_output(v);
        TwinRun run(std::move(g), rng, fill, step);
        CHECK(run.lowerings() == std::vector<std::string>{"max_pool2d"});
        for (ValueId v : checked) {
          CAPTURE(run.graph().value(v).name);
          CHECK(run.error(v) == 0.0);
        }
      }
    }
}

TEST_CASE("max_pool2d_backward on windows that tile the plane (packed rows) matches the CPU bit for bit") {
  // [relu_backward ->] max_pool2d_backward [-> relu_backward] [-> dropout2d_backward],
  // each chain with only its result read after the launch, and with every intermediate.
  struct Chain {
    bool relu_before, relu_after, dropout, intermediates;
  };
  std::vector<Chain> chains;
  for (int bits = 0; bits < 8; ++bits) chains.push_back({(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, false});
  chains.push_back({true, true, true, true});
  chains.push_back({false, true, false, true});
  auto rng = sg::test::fresh_rng();
  for (const Window& win : kWindows)
    for (const DType dtype : kDtypes) {
      const Shape x_shape{pick(rng, 1, 5), pick(rng, 1, 7), win.h, win.w};
      const Shape dy_shape = pooled_shape(x_shape, win);
      const Pool2dAttrs pool{win.kernel, win.kernel};
      const DropoutAttrs dropout{0.25, rng(), 1};
      const std::int32_t step = static_cast<std::int32_t>(pick(rng, 0, 5000));
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {} kernel {} step {}", dtype_name(dtype), fmt::join(x_shape, "x"), win.kernel, step));
      for (std::size_t k = 0; k < chains.size(); ++k) {
        const Chain& chain = chains[k];
        CAPTURE(fmt::format("relu before {} relu after {} dropout {} intermediates {}", chain.relu_before,
                            chain.relu_after, chain.dropout, chain.intermediates));
        Graph g;
        const ValueId dy = g.input("dy", dy_shape, dtype);
        const ValueId x = g.input("x", x_shape, dtype);
        std::vector<ValueId> intermediates;
        ValueId grad = dy;
        if (chain.relu_before) {
          const ValueId relu_out = g.input("relu_before_out", dy_shape, dtype);
          grad = g.append_node(OpKind::relu_backward, {grad, relu_out}, NoAttrs{}).front();
          intermediates.push_back(grad);
        }
        grad = g.append_node(OpKind::max_pool2d_backward, {grad, x}, pool).front();
        intermediates.push_back(grad);
        if (chain.relu_after) {
          const ValueId relu_out = g.input("relu_after_out", x_shape, dtype);
          grad = g.append_node(OpKind::relu_backward, {grad, relu_out}, NoAttrs{}).front();
          intermediates.push_back(grad);
        }
        if (chain.dropout) {
          const ValueId s = g.state("step", {1}, DType::i32);
          grad = g.append_node(OpKind::dropout2d_backward, {grad, s}, dropout).front();
        } else {
          intermediates.pop_back();  // the result itself
        }
        std::vector<ValueId> checked = {grad};
        if (chain.intermediates) checked.insert(checked.end(), intermediates.begin(), intermediates.end());
        for (ValueId v : checked) g.mark_output(v);
        // Small integers (ties: the first-maximum rule) every other chain.
        TwinRun run(std::move(g), rng, Fill{k % 2 == 0}, step);
        CHECK(run.lowerings() == std::vector<std::string>{"max_pool2d_backward"});
        for (ValueId v : checked) {
          CAPTURE(run.graph().value(v).name);
          CHECK(run.error(v) == 0.0);
        }
      }
    }
}

namespace {

// A tensor on the GPU `offset` bytes past its allocation's start (offset 0:
// cudaMalloc's 256-byte alignment), poisoned with 0xff bytes (NaN in every
// float type): an element the kernel does not write reads NaN.
class OffsetTensor {
 public:
  OffsetTensor(std::size_t bytes, std::size_t offset) : buffer_(bytes + offset), bytes_(bytes), offset_(offset) {
    buffer_.fill_bytes(0xff);
  }
  void* ptr() const { return static_cast<char*>(buffer_.data()) + offset_; }
  void upload(const std::string& bytes) { buffer_.upload(bytes.data(), bytes.size(), offset_); }
  std::string download() const {
    std::string bytes(bytes_, '\0');
    SG_CUDA_CHECK(cudaDeviceSynchronize());
    buffer_.download(bytes.data(), bytes.size(), offset_);
    return bytes;
  }

 private:
  cuda::DeviceBuffer buffer_;
  std::size_t bytes_, offset_;
};

// `count` random values of `dtype` (U(-2, 2), or small integers: ties) as the GPU holds them.
std::string random_bytes(std::mt19937_64& rng, DType dtype, std::int64_t count, bool ties) {
  std::vector<float> host(static_cast<std::size_t>(count));
  if (ties)
    for (auto& x : host) x = static_cast<float>(static_cast<int>(rng() % 5) - 2);
  else
    sg::test::fill_uniform(host, rng, -2.0, 2.0);
  return blob_from_floats("t", {count}, dtype, host).bytes;
}

// Whether every element of `bytes` (of dtype) is finite: the kernel wrote it.
bool all_written(const std::string& bytes, DType dtype) {
  const std::int64_t count = static_cast<std::int64_t>(bytes.size() / dtype_size(dtype));
  const auto values = floats_from_blob(io::TensorBlob{"t", dtype, {count}, bytes});
  for (float v : values)
    if (!std::isfinite(v)) return false;
  return true;
}

// The offsets (bytes) the misaligned launches use: 1, 2 and 4 elements (no
// packs, 4-byte packs, 8-byte packs for 2-byte types), for the plane-sized
// tensors and the pooled-sized ones apart.
struct Offsets {
  std::size_t plane, out;
};
std::vector<Offsets> misalignments(DType dtype) {
  const std::size_t e = dtype_size(dtype);
  return {{e, e}, {2 * e, 2 * e}, {4 * e, 4 * e}, {0, e}, {e, 0}};
}

// A step counter on the device holding `value`.
OffsetTensor step_counter(std::int32_t value) {
  OffsetTensor step(sizeof value, 0);
  step.upload(std::string(reinterpret_cast<const char*>(&value), sizeof value));
  return step;
}

// launch(offsets) -> the launch's outputs (bytes): the aligned launch writes
// every element, and each misaligned one gives its bits.
template <typename Launch>
void check_offsets_match_aligned(Launch&& launch, DType dtype) {
  const auto aligned = launch(Offsets{0, 0});
  for (const std::string& t : aligned) CHECK(all_written(t, dtype));
  for (const Offsets at : misalignments(dtype)) {
    CAPTURE(fmt::format("offsets {} {}", at.plane, at.out));
    CHECK(launch(at) == aligned);
  }
}

// f(geometry, dtype, dropout on) over the tiling windows' cases of the
// misaligned launches: 2x2 and 3x3 windows, a random plane count.
template <typename F>
void for_each_offset_case(std::mt19937_64& rng, F&& f) {
  for (const Window win : {Window{2, 28, 28}, Window{2, 16, 16}, Window{3, 12, 12}, Window{3, 6, 6}})
    for (const DType dtype : kDtypes)
      for (const bool dropout_on : {false, true}) {
        const cuda::PoolGeometry g{pick(rng, 1, 40), win.h, win.w, win.kernel, win.kernel};
        CAPTURE(sg::test::last_seed());
        CAPTURE(fmt::format("{} planes {} {}x{} kernel {} dropout {}", dtype_name(dtype), g.planes, g.h, g.w, g.kernel,
                            dropout_on));
        f(g, dtype, dropout_on);
      }
}

}  // namespace

TEST_CASE("max_pool2d forward on tensors offset from their alignment gives the bits of the aligned launch") {
  auto rng = sg::test::fresh_rng();
  cuda::Stream stream;
  for_each_offset_case(rng, [&](const cuda::PoolGeometry& g, DType dtype, bool dropout_on) {
    const std::int64_t in_count = g.planes * g.h * g.w, out_count = g.planes * g.oh() * g.ow();
    const std::size_t e = dtype_size(dtype);
    cuda::PlaneDropout dropout;
    if (dropout_on) dropout = {true, {rng(), 2, philox::dropout_threshold(0.5), 2.f}};
    const OffsetTensor step = step_counter(17);
    const std::string x_bytes = random_bytes(rng, dtype, in_count, dropout_on);
    // The outputs (dropped, pooled, activated) at the given offsets.
    const auto launch = [&](Offsets at) {
      OffsetTensor x(x_bytes.size(), at.plane), dropped(x_bytes.size(), at.plane);
      OffsetTensor pooled(std::size_t(out_count) * e, at.out), activated(std::size_t(out_count) * e, at.out);
      x.upload(x_bytes);
      with_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        const auto* step_ptr = static_cast<const std::int32_t*>(step.ptr());
        cuda::launch_max_pool2d_forward(static_cast<const T*>(x.ptr()), step_ptr, g, dropout,
                                        dropout_on ? static_cast<T*>(dropped.ptr()) : nullptr,
                                        static_cast<T*>(pooled.ptr()), static_cast<T*>(activated.ptr()), stream.get());
      });
      std::vector<std::string> out = {pooled.download(), activated.download()};
      if (dropout_on) out.push_back(dropped.download());
      return out;
    };
    check_offsets_match_aligned(launch, dtype);
  });
}

TEST_CASE("max_pool2d_backward on tensors offset from their alignment gives the bits of the aligned launch") {
  auto rng = sg::test::fresh_rng();
  cuda::Stream stream;
  for_each_offset_case(rng, [&](const cuda::PoolGeometry& g, DType dtype, bool dropout_on) {
    const std::int64_t in_count = g.planes * g.h * g.w, out_count = g.planes * g.oh() * g.ow();
    const std::size_t in_bytes = std::size_t(in_count) * dtype_size(dtype);
    const std::size_t out_bytes = std::size_t(out_count) * dtype_size(dtype);
    cuda::PlaneDropout dropout;
    if (dropout_on) dropout = {true, {rng(), 5, philox::dropout_threshold(0.25), 4.f / 3.f}};
    const OffsetTensor step = step_counter(3);
    const std::string dy = random_bytes(rng, dtype, out_count, false);
    const std::string relu_before = random_bytes(rng, dtype, out_count, false);
    const std::string x = random_bytes(rng, dtype, in_count, true);  // ties
    const std::string relu_after = random_bytes(rng, dtype, in_count, false);
    // The whole chain with every intermediate written; without dropout the
    // relu_backward's output is the result.
    const auto launch = [&](Offsets at) {
      OffsetTensor dy_t(out_bytes, at.out), rb_t(out_bytes, at.out), rb_grad(out_bytes, at.out);
      OffsetTensor x_t(in_bytes, at.plane), ra_t(in_bytes, at.plane), pool_grad(in_bytes, at.plane),
          ra_grad(in_bytes, at.plane), dx(in_bytes, at.plane);
      dy_t.upload(dy);
      rb_t.upload(relu_before);
      x_t.upload(x);
      ra_t.upload(relu_after);
      with_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        cuda::PoolBackwardTensors<T> t;
        t.dy = static_cast<const T*>(dy_t.ptr());
        t.relu_before = static_cast<const T*>(rb_t.ptr());
        t.x = static_cast<const T*>(x_t.ptr());
        t.relu_after = static_cast<const T*>(ra_t.ptr());
        t.relu_before_grad = static_cast<T*>(rb_grad.ptr());
        t.pool_grad = static_cast<T*>(pool_grad.ptr());
        t.relu_after_grad = static_cast<T*>(ra_grad.ptr());
        t.dx = dropout_on ? static_cast<T*>(dx.ptr()) : t.relu_after_grad;
        cuda::launch_max_pool2d_backward(t, static_cast<const std::int32_t*>(step.ptr()), g, dropout, stream.get());
      });
      std::vector<std::string> out = {rb_grad.download(), pool_grad.download(), ra_grad.download()};
      if (dropout_on) out.push_back(dx.download());
      return out;
    };
    check_offsets_match_aligned(launch, dtype);
  });
}
