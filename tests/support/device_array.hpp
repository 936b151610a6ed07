#pragma once
// Test helper: a device array filled from / read back to host floats, in
// f16, bf16 or f32 storage, poisoned (NaN) on request.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::test {

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n), buf_(n * sizeof(T)) { poison(); }
  explicit DeviceArray(const std::vector<float>& host) : DeviceArray(host.size()) { upload(host); }

  void upload(const std::vector<float>& host) {
    std::vector<T> tmp(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) tmp[i] = static_cast<T>(host[i]);
    buf_.upload(tmp.data(), tmp.size() * sizeof(T));
  }
  std::vector<float> download() const {
    std::vector<T> tmp(n_);
    SG_CUDA_CHECK(cudaDeviceSynchronize());
    buf_.download(tmp.data(), tmp.size() * sizeof(T));
    std::vector<float> out(n_);
    for (std::size_t i = 0; i < n_; ++i) out[i] = static_cast<float>(tmp[i]);
    return out;
  }
  void poison() {
    cuda::launch_poison(buf_.data(), buf_.bytes(), nullptr);
    SG_CUDA_CHECK(cudaDeviceSynchronize());
  }
  T* get() { return buf_.as<T>(); }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_;
  cuda::DeviceBuffer buf_;
};

// SGD scalars, one per parameter group, in device memory as kernels read them.
inline cuda::DeviceBuffer device_update_scalars(const std::vector<cuda::UpdateScalars>& host) {
  cuda::DeviceBuffer buffer(host.size() * sizeof(cuda::UpdateScalars));
  buffer.upload(host.data(), buffer.bytes());
  return buffer;
}

// Values exactly representable in T (so CPU reference and GPU see the same inputs).
template <typename T>
std::vector<float> representable(std::vector<float> v) {
  for (auto& x : v) x = static_cast<float>(static_cast<T>(x));
  return v;
}

inline std::vector<float> uniform(std::size_t n, std::mt19937_64& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace sg::test
