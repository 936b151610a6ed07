// The multi-tensor scale a symmetric-memory all-reduce ends with
// (ops/cuda/scale_multi_tensor.hpp): f32, f16 and bf16 tensors of odd sizes in
// one launch, scaled in place by 1/2 and 1/3, against the same product rounded
// on the host (bit for bit), and the bytes around each tensor left alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>
#include <random>
#include <vector>

#include "ops/cuda/scale_multi_tensor.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg::cuda;

namespace {

std::size_t element_bytes(ScaledType t) { return t == ScaledType::f32 ? 4 : 2; }

float load(ScaledType t, const unsigned char* p) {
  if (t == ScaledType::f32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (t == ScaledType::f16) {
    __half h;
    std::memcpy(&h, p, 2);
    return __half2float(h);
  }
  __nv_bfloat16 b;
  std::memcpy(&b, p, 2);
  return __bfloat162float(b);
}

void store(ScaledType t, unsigned char* p, float v) {
  if (t == ScaledType::f32) std::memcpy(p, &v, 4);
  else if (t == ScaledType::f16) {
    const __half h = __float2half(v);
    std::memcpy(p, &h, 2);
  } else {
    const __nv_bfloat16 b = __float2bfloat16(v);
    std::memcpy(p, &b, 2);
  }
}

}  // namespace

TEST_CASE("scale_multi_tensor scales every tensor in place with the host's rounding and touches nothing else") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  const std::vector<ScaledType> types = {ScaledType::f16, ScaledType::f32, ScaledType::bf16, ScaledType::f16};
  for (const float factor : {0.5f, 1.0f / 3.0f}) {
    std::uniform_int_distribution<std::int64_t> size(1, 9000);
    std::vector<std::int64_t> counts;
    std::vector<std::size_t> offsets;
    std::size_t bytes = 64;  // a guard before the first tensor
    for (ScaledType t : types) {
      counts.push_back(size(rng));
      bytes = (bytes + 15) / 16 * 16;
      offsets.push_back(bytes);
      bytes += static_cast<std::size_t>(counts.back()) * element_bytes(t) + 64;  // and a guard after each
    }
    std::vector<unsigned char> host(bytes, 0xA5);
    std::normal_distribution<float> value(0.f, 3.f);
    for (std::size_t i = 0; i < types.size(); ++i)
      for (std::int64_t e = 0; e < counts[i]; ++e)
        store(types[i], host.data() + offsets[i] + e * element_bytes(types[i]), value(rng));
    DeviceBuffer device(bytes);
    device.upload(host.data(), bytes);
    std::vector<ScaledTensor> tensors;
    for (std::size_t i = 0; i < types.size(); ++i)
      tensors.push_back({device.as<unsigned char>() + offsets[i], device.as<unsigned char>() + offsets[i], counts[i],
                         types[i]});
    ScaleMultiTensor scale(tensors, factor);
    scale.launch(nullptr);
    std::vector<unsigned char> out(bytes);
    device.download(out.data(), bytes);
    std::vector<unsigned char> expected = host;
    for (std::size_t i = 0; i < types.size(); ++i)
      for (std::int64_t e = 0; e < counts[i]; ++e) {
        unsigned char* p = expected.data() + offsets[i] + e * element_bytes(types[i]);
        store(types[i], p, load(types[i], p) * factor);
      }
    std::size_t differing = 0;
    for (std::size_t b = 0; b < bytes; ++b) differing += out[b] != expected[b];
    CAPTURE(fmt::format("factor {} sizes {} {} {} {}", factor, counts[0], counts[1], counts[2], counts[3]));
    CHECK(differing == 0);
    CHECK(std::memcmp(out.data(), host.data(), 64) == 0);  // the guard really is untouched (and the check can fail)
    CHECK(std::memcmp(out.data(), host.data(), bytes) != 0);
  }
}

TEST_CASE("scale_multi_tensor gathers tensors into one buffer and scatters them back scaled") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  std::uniform_int_distribution<std::int64_t> size(1, 5000);
  const std::vector<std::int64_t> counts = {size(rng), size(rng), size(rng)};
  std::int64_t total = 0;
  for (auto c : counts) total += c;
  std::vector<__half> host(static_cast<std::size_t>(total));
  std::normal_distribution<float> value(0.f, 2.f);
  for (auto& h : host) h = __float2half(value(rng));
  // Three separate tensors in, one packed staging buffer in between, three separate tensors out (poisoned).
  DeviceBuffer in(static_cast<std::size_t>(total) * 2 + 3 * 256), staging(static_cast<std::size_t>(total) * 2),
      out(static_cast<std::size_t>(total) * 2 + 3 * 256);
  out.fill_bytes(0xFF);
  std::vector<ScaledTensor> gather, scatter;
  std::int64_t packed = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const std::size_t spaced = i * 256 + static_cast<std::size_t>(packed) * 2;
    in.upload(host.data() + packed, static_cast<std::size_t>(counts[i]) * 2, spaced);
    gather.push_back({in.as<char>() + spaced, staging.as<__half>() + packed, counts[i], ScaledType::f16});
    scatter.push_back({staging.as<__half>() + packed, out.as<char>() + spaced, counts[i], ScaledType::f16});
    packed += counts[i];
  }
  ScaleMultiTensor(gather, 1.0f).launch(nullptr);
  std::vector<__half> staged(static_cast<std::size_t>(total));
  staging.download(staged.data(), staged.size() * 2);
  CHECK(std::memcmp(staged.data(), host.data(), staged.size() * 2) == 0);
  ScaleMultiTensor(scatter, 0.5f).launch(nullptr);
  packed = 0;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    std::vector<__half> got(static_cast<std::size_t>(counts[i]));
    out.download(got.data(), got.size() * 2, i * 256 + static_cast<std::size_t>(packed) * 2);
    for (std::int64_t e = 0; e < counts[i]; ++e) {
      const __half want = __float2half(__half2float(host[static_cast<std::size_t>(packed + e)]) * 0.5f);
      differing += std::memcmp(&got[static_cast<std::size_t>(e)], &want, 2) != 0;
    }
    packed += counts[i];
  }
  CHECK(differing == 0);
}
