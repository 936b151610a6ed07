#pragma once
// What the channels-last kernel tests (test_channels_last_pool.cpp,
// test_channels_last_sums.cpp) share: the element types, device tensors
// offset from their alignment and poisoned, bit comparisons, host
// transposes and the value draws.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/cpu/conv_reference.hpp"
#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/channels_last.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/kernels.hpp"
#include "tests/runtime/test_support.hpp"

namespace sg::test::channels_last {

using namespace ::sg;
using sg::test::pick;

// f(T{}) for each element type the kernels are instantiated for.
template <typename F>
void for_each_type(F&& f) {
  f(float{});
  f(__half{});
  f(__nv_bfloat16{});
}
template <typename T>
const char* type_name() {
  return std::is_same_v<T, float> ? "f32" : std::is_same_v<T, __half> ? "f16" : "bf16";
}

// v rounded to T (round to nearest even, as the kernels' from_float).
template <typename T>
float round_to(float v) {
  return static_cast<float>(static_cast<T>(v));
}

// A device tensor of `count` T, `offset` elements past its allocation's
// (256-byte aligned) start: an offset of 1 takes every pack path away.
// Poisoned (NaN) when made.
template <typename T>
class Tensor {
 public:
  explicit Tensor(std::size_t count, std::size_t offset = 0)
      : count_(count), offset_(offset), buffer_((count + offset) * sizeof(T)) {
    cuda::launch_poison(get(), count_ * sizeof(T), nullptr);
    SG_CUDA_CHECK(cudaDeviceSynchronize());
  }
  Tensor(const std::vector<float>& host, std::size_t offset) : Tensor(host.size(), offset) { upload(host); }
  T* get() const { return buffer_.as<T>() + offset_; }
  void upload(const std::vector<float>& host) {
    std::vector<T> typed(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) typed[i] = static_cast<T>(host[i]);
    SG_CUDA_CHECK(cudaMemcpy(get(), typed.data(), typed.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<float> download() const {
    std::vector<T> typed(count_);
    SG_CUDA_CHECK(cudaDeviceSynchronize());
    SG_CUDA_CHECK(cudaMemcpy(typed.data(), get(), typed.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return std::vector<float>(typed.begin(), typed.end());
  }

 private:
  std::size_t count_, offset_;
  cuda::DeviceBuffer buffer_;
};

// "" when got and want hold the same bits (any NaN matching any NaN: a NaN's
// payload may change through f32), else the first difference.
inline std::string bit_difference(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return fmt::format("{} elements, {} expected", got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::uint32_t a = 0, b = 0;
    std::memcpy(&a, &got[i], sizeof a);
    std::memcpy(&b, &want[i], sizeof b);
    if (a != b && !(std::isnan(got[i]) && std::isnan(want[i])))
      return fmt::format("element {}: {} (0x{:08x}), expected {} (0x{:08x})", i, got[i], a, want[i], b);
  }
  return "";
}

// [n, c, hw] <-> [n, hw, c] on the host.
template <typename V>
std::vector<V> transposed(const std::vector<V>& x, std::int64_t n, std::int64_t rows, std::int64_t cols) {
  std::vector<V> y(x.size());
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) y[(i * cols + c) * rows + r] = x[(i * rows + r) * cols + c];
  return y;
}
inline std::vector<float> to_nchw(const std::vector<float>& x, std::int64_t n, std::int64_t hw, std::int64_t c) {
  return transposed(x, n, hw, c);
}
inline std::vector<float> to_nhwc(const std::vector<float>& x, std::int64_t n, std::int64_t hw, std::int64_t c) {
  return transposed(x, n, c, hw);
}

// What the pooling's input holds: uniform values, small integers (windows
// full of ties), one constant (every window a tie), or uniform with about
// one NaN in eight (windows with a NaN, some with two).
enum class Values { uniform, ties, constant, nan };
inline const char* values_name(Values v) {
  return v == Values::uniform ? "uniform" : v == Values::ties ? "ties" : v == Values::constant ? "constant" : "nan";
}

template <typename T>
std::vector<float> draw(std::size_t count, Values values, std::mt19937_64& rng) {
  std::vector<float> v(count);
  sg::test::fill_uniform(v, rng, -2.0, 2.0);
  for (float& x : v) {
    if (values == Values::ties) x = static_cast<float>(static_cast<int>(rng() % 5) - 2);
    if (values == Values::constant) x = 1.5f;
    if (values == Values::nan && rng() % 8 == 0) x = NAN;
    x = round_to<T>(x);
  }
  return v;
}
// A relu's output: uniform values with the negative half set to 0.
template <typename T>
std::vector<float> draw_relu_output(std::size_t count, std::mt19937_64& rng) {
  std::vector<float> v = draw<T>(count, Values::uniform, rng);
  for (float& x : v) x = x > 0.f ? x : 0.f;
  return v;
}

}  // namespace sg::test::channels_last
