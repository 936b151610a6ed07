#pragma once
// What test_batch_norm_rows_kernels.cpp's cases share: one case of the rows
// path (x [rows, C] and every other input drawn, rounded to T and on the
// device; launches of the forward, backward and running statistics on
// poisoned outputs and a poisoned workspace) and the CPU reference in double
// (ops/cpu/norm_reference.hpp) on the transposed [1, C, rows] view: the same
// per-channel statistics over the same rows, its loops along memory. Either
// of the path's ways: one cooperative launch, or two (set_cooperative).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "graph/dtype.hpp"
#include "ops/cpu/layout_reference.hpp"
#include "ops/cpu/norm_reference.hpp"
#include "ops/cuda/batch_norm.hpp"
#include "tests/kernels/channels_last_test_support.hpp"

namespace sg::test::batch_norm_rows {

using sg::test::channels_last::round_to;
using sg::test::channels_last::Tensor;

constexpr double kEps = 1e-5, kMomentum = 0.1;

template <typename T>
sg::DType dtype_of() {
  return std::is_same_v<T, float> ? sg::DType::f32 : std::is_same_v<T, __half> ? sg::DType::f16 : sg::DType::bf16;
}

// rows x channels; offset: elements every T tensor starts past its 256-byte
// aligned allocation (1: no 16-byte packs, one value at a time).
struct RowsShape {
  std::int64_t rows, channels;
  std::size_t offset = 0;
};

// [rows, C] -> [C, rows] in double, and back: the layout reference's
// channels-last <-> channels-first of one image of `rows` pixels.
inline std::vector<double> planes_of(const std::vector<float>& x, std::int64_t rows, std::int64_t channels) {
  const std::vector<double> wide(x.begin(), x.end());
  std::vector<double> t(x.size());
  ref::to_channels_first(wide.data(), 1, channels, rows, t.data());
  return t;
}
inline std::vector<double> rows_of(const std::vector<double>& t, std::int64_t rows, std::int64_t channels) {
  std::vector<double> x(t.size());
  ref::to_channels_last(t.data(), 1, channels, rows, x.data());
  return x;
}

// Which backward: the gradient's relu_out mask and dy_other, and which outputs it writes.
struct BackwardVariant {
  bool relu, other, dx, dgamma, dbeta;
};

struct ForwardOut {
  std::vector<float> y, running_mean, running_var;
};
struct BackwardOut {
  std::vector<float> dx, dgamma, dbeta;
};

// The reference's backward: dx [rows, C], dgamma, dbeta and, per channel,
// the sums of the magnitudes of their terms (|g * xhat|, |g|), which their
// roundings scale with (both sums cancel).
struct BackwardReference {
  std::vector<double> dx, dgamma, dbeta, dgamma_terms, dbeta_terms;
};

template <typename T>
class RowsCase {
 public:
  RowsCase(const RowsShape& shape, std::mt19937_64& rng, double x_lo = -2.0, double x_hi = 2.0)
      : shape_(shape),
        x(draw(rng, count(), x_lo, x_hi)),
        gamma(draw(rng, channels(), 0.5, 1.5)),
        beta(draw(rng, channels(), -0.5, 0.5)),
        skip(draw(rng, count(), -1.0, 1.0)),
        dy(draw(rng, count(), -1.0, 1.0)),
        dy_other(draw(rng, count(), -1.0, 1.0)),
        relu_out(relu_of(draw(rng, count(), -1.0, 1.0))),
        running_mean(draw_f32(rng, channels(), -1.0, 1.0)),
        running_var(draw_f32(rng, channels(), 0.5, 1.5)),
        d_x_(x, shape.offset),
        d_gamma_(gamma, shape.offset),
        d_beta_(beta, shape.offset),
        d_skip_(skip, shape.offset),
        d_dy_(dy, shape.offset),
        d_dy_other_(dy_other, shape.offset),
        d_relu_out_(relu_out, shape.offset),
        workspace_(std::max<std::size_t>(cuda::batch_norm_workspace_bytes(kernel_shape()), 1)),
        finished_(sizeof(unsigned)) {
    finished_.fill_bytes(0);  // (every launch leaves it 0 again)
  }

  std::size_t count() const { return static_cast<std::size_t>(shape_.rows * shape_.channels); }
  std::size_t channels() const { return static_cast<std::size_t>(shape_.channels); }
  cuda::BatchNormShape kernel_shape() const {
    return {shape_.rows, shape_.channels, 1, static_cast<float>(kEps), static_cast<float>(kMomentum)};
  }
  cudaStream_t stream() const { return stream_.get(); }

  // The scratch of one launch, its workspace poisoned first (in stream
  // order): a per-channel value the last block does not write reads NaN.
  cuda::BatchNormRowsScratch scratch() const {
    cuda::launch_poison(workspace_.data(), workspace_.bytes(), stream());
    return {workspace_.data(), finished_.as<unsigned>(), true, cooperative_};
  }
  // Whether launches may take the one cooperative launch (the default) or keep to the two launches.
  void set_cooperative(bool on) { cooperative_ = on; }

  // Launches into caller-made outputs (poisoned when made).
  void launch_forward(T* y, float* rm, float* rv, bool residual, bool relu) const {
    cuda::launch_batch_norm_forward<T>(d_x_.get(), d_gamma_.get(), d_beta_.get(), kernel_shape(), y, stream(), rm, rv,
                                       residual ? d_skip_.get() : nullptr, relu, scratch());
  }
  void launch_backward(const BackwardVariant& v, T* dx, T* dgamma, T* dbeta) const {
    cuda::launch_batch_norm_backward<T>(d_dy_.get(), d_x_.get(), d_gamma_.get(), kernel_shape(), v.dx ? dx : nullptr,
                                        v.dgamma ? dgamma : nullptr, v.dbeta ? dbeta : nullptr, stream(),
                                        v.relu ? d_relu_out_.get() : nullptr, v.other ? d_dy_other_.get() : nullptr,
                                        scratch());
  }

  ForwardOut forward(bool stats, bool residual, bool relu) const {
    const Tensor<T> y(count(), shape_.offset);
    const Tensor<float> rm(running_mean, 0), rv(running_var, 0);
    launch_forward(y.get(), stats ? rm.get() : nullptr, stats ? rv.get() : nullptr, residual, relu);
    return {y.download(), stats ? rm.download() : std::vector<float>{}, stats ? rv.download() : std::vector<float>{}};
  }
  BackwardOut backward(const BackwardVariant& v) const {
    const Tensor<T> dx(count(), shape_.offset), dgamma(channels(), shape_.offset), dbeta(channels(), shape_.offset);
    launch_backward(v, dx.get(), dgamma.get(), dbeta.get());
    const std::vector<float> none;
    return {v.dx ? dx.download() : none, v.dgamma ? dgamma.download() : none, v.dbeta ? dbeta.download() : none};
  }
  ForwardOut stats_update() const {
    const Tensor<float> rm(running_mean, 0), rv(running_var, 0);
    cuda::launch_batch_norm_stats_update<T>(d_x_.get(), kernel_shape(), rm.get(), rv.get(), stream(), scratch());
    return {{}, rm.download(), rv.download()};
  }

  // The reference's forward: the normalised values (before any add or ReLU) and the running statistics.
  ForwardOut reference_forward(std::vector<double>& normalised) const {
    const std::int64_t rows = shape_.rows, c = shape_.channels;
    const auto xt = planes_of(x, rows, c);
    const std::vector<double> g(gamma.begin(), gamma.end()), b(beta.begin(), beta.end());
    std::vector<double> yt(xt.size()), rm(running_mean.begin(), running_mean.end());
    std::vector<double> rv(running_var.begin(), running_var.end());
    ref::batch_norm(xt.data(), g.data(), b.data(), 1, c, rows, kEps, yt.data());
    ref::batch_norm_stats_update(xt.data(), 1, c, rows, kMomentum, rm.data(), rv.data());
    normalised = rows_of(yt, rows, c);
    return {{}, std::vector<float>(rm.begin(), rm.end()), std::vector<float>(rv.begin(), rv.end())};
  }
  // y from the normalised values as the launch's fusions give it: the add
  // after the normalised value is rounded to T (as the graph stores it).
  std::vector<double> fused_output(const std::vector<double>& normalised, bool residual, bool relu) const {
    std::vector<double> y(normalised.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      double v = normalised[i];
      if (residual) v = double(round_to<T>(float(v))) + skip[i];
      y[i] = relu ? std::max(v, 0.0) : v;
    }
    return y;
  }

  BackwardReference reference_backward(bool relu, bool other) const {
    const std::int64_t rows = shape_.rows, c = shape_.channels;
    std::vector<float> grad = dy;
    for (std::size_t i = 0; i < grad.size(); ++i) {
      if (other) grad[i] = round_to<T>(grad[i] + dy_other[i]);
      if (relu && !(relu_out[i] > 0.f)) grad[i] = 0.f;
    }
    const auto xt = planes_of(x, rows, c), gt = planes_of(grad, rows, c);
    const std::vector<double> g(gamma.begin(), gamma.end());
    BackwardReference r;
    std::vector<double> dxt(xt.size());
    r.dgamma.resize(channels());
    r.dbeta.resize(channels());
    ref::batch_norm_backward(gt.data(), xt.data(), g.data(), 1, c, rows, kEps, dxt.data(), r.dgamma.data(),
                             r.dbeta.data());
    r.dx = rows_of(dxt, rows, c);
    r.dgamma_terms.assign(channels(), 0.0);
    r.dbeta_terms.assign(channels(), 0.0);
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const auto m = ref::channel_moments(xt.data(), 1, c, rows, ch, kEps);
      for (std::int64_t k = ch * rows; k < (ch + 1) * rows; ++k) {
        const auto at = static_cast<std::size_t>(k);
        r.dgamma_terms[static_cast<std::size_t>(ch)] += std::abs(gt[at] * (xt[at] - m.mean) * m.rstd);
        r.dbeta_terms[static_cast<std::size_t>(ch)] += std::abs(gt[at]);
      }
    }
    return r;
  }

 private:
  static std::vector<float> draw(std::mt19937_64& rng, std::size_t n, double lo, double hi) {
    std::vector<float> v = draw_f32(rng, n, lo, hi);
    for (float& e : v) e = round_to<T>(e);
    return v;
  }
  // A ReLU's output: zeros where the mask stops the gradient.
  static std::vector<float> relu_of(std::vector<float> v) {
    for (float& e : v) e = std::max(e, 0.f);
    return v;
  }
  static std::vector<float> draw_f32(std::mt19937_64& rng, std::size_t n, double lo, double hi) {
    std::vector<float> v(n);
    sg::test::fill_uniform(v, rng, lo, hi);
    return v;
  }

  RowsShape shape_;
  bool cooperative_ = true;

 public:
  // The host inputs (T's values as floats); the running statistics' values before the launch.
  std::vector<float> x, gamma, beta, skip, dy, dy_other, relu_out, running_mean, running_var;

 private:
  cuda::Stream stream_;
  Tensor<T> d_x_, d_gamma_, d_beta_, d_skip_, d_dy_, d_dy_other_, d_relu_out_;
  cuda::DeviceBuffer workspace_, finished_;
};

}  // namespace sg::test::batch_norm_rows
