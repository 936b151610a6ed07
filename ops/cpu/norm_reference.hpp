#pragma once
// CPU reference of layer and batch normalisation (issue 37). LayerNorm over
// every value of an example: x [rows, d] -> y = (x - mean) * rstd * gamma +
// beta with mean and the biased variance of the row, rstd = 1 / sqrt(var +
// eps). The backward recomputes mean and rstd from x (nothing is saved by
// the forward) and gives
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,
//   dgamma = sum over rows of dy * xhat,  dbeta = sum over rows of dy,
// with xhat = (x - mean) * rstd. Sums run in index order.
#include <cmath>
#include <cstdint>

namespace sg::ref {

template <typename T>
struct RowMoments {
  T mean, rstd;
};

template <typename T>
RowMoments<T> row_moments(const T* x, std::int64_t d, double eps) {
  T sum = T(0);
  for (std::int64_t j = 0; j < d; ++j) sum += x[j];
  const T mean = sum / static_cast<T>(d);
  T squares = T(0);
  for (std::int64_t j = 0; j < d; ++j) squares += (x[j] - mean) * (x[j] - mean);
  const T var = squares / static_cast<T>(d);
  return {mean, T(1) / std::sqrt(var + static_cast<T>(eps))};
}

template <typename T>
void layer_norm(const T* x, const T* gamma, const T* beta, std::int64_t rows, std::int64_t d, double eps, T* y) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const auto m = row_moments(x + i * d, d, eps);
    for (std::int64_t j = 0; j < d; ++j) y[i * d + j] = (x[i * d + j] - m.mean) * m.rstd * gamma[j] + beta[j];
  }
}

template <typename T>
void layer_norm_backward(const T* dy, const T* x, const T* gamma, std::int64_t rows, std::int64_t d, double eps,
                         T* dx, T* dgamma, T* dbeta) {
  for (std::int64_t j = 0; j < d; ++j) dgamma[j] = dbeta[j] = T(0);
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* xr = x + i * d;
    const T* dyr = dy + i * d;
    const auto m = row_moments(xr, d, eps);
    T g_sum = T(0), gx_sum = T(0);
    for (std::int64_t j = 0; j < d; ++j) {
      const T g = dyr[j] * gamma[j];
      g_sum += g;
      gx_sum += g * (xr[j] - m.mean) * m.rstd;
    }
    const T g_mean = g_sum / static_cast<T>(d), gx_mean = gx_sum / static_cast<T>(d);
    for (std::int64_t j = 0; j < d; ++j) {
      const T xhat = (xr[j] - m.mean) * m.rstd;
      dx[i * d + j] = m.rstd * (dyr[j] * gamma[j] - g_mean - xhat * gx_mean);
      dgamma[j] += dyr[j] * xhat;
      dbeta[j] += dyr[j];
    }
  }
}

// ---- batch normalisation (PyTorch's BatchNorm1d/2d): x [n, channels, plane]
// (plane = H*W, or 1 for [n, channels]); channel c's statistics over its
// n * plane values (the biased variance normalises; the running variance
// takes the unbiased one, as PyTorch).

// Mean and 1/std of channel c over every example and position, two passes.
// The sums run in double: a channel holds up to ~100k values, and the oracle
// should not carry a sequential f32 sum's error into the comparisons.
template <typename T>
RowMoments<T> channel_moments(const T* x, std::int64_t n, std::int64_t channels, std::int64_t plane, std::int64_t c,
                              double eps, T* biased_var = nullptr) {
  double sum = 0.0;
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t k = 0; k < plane; ++k) sum += static_cast<double>(x[(b * channels + c) * plane + k]);
  const double count = static_cast<double>(n * plane);
  const T mean = static_cast<T>(sum / count);
  double squares = 0.0;
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t k = 0; k < plane; ++k) {
      const double d = static_cast<double>(x[(b * channels + c) * plane + k]) - static_cast<double>(mean);
      squares += d * d;
    }
  const T var = static_cast<T>(squares / count);
  if (biased_var) *biased_var = var;
  return {mean, T(1) / std::sqrt(var + static_cast<T>(eps))};
}

// Training mode: each channel normalised by its batch statistics.
template <typename T>
void batch_norm(const T* x, const T* gamma, const T* beta, std::int64_t n, std::int64_t channels, std::int64_t plane,
                double eps, T* y) {
  for (std::int64_t c = 0; c < channels; ++c) {
    const auto m = channel_moments(x, n, channels, plane, c, eps);
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t k = 0; k < plane; ++k) {
        const std::int64_t at = (b * channels + c) * plane + k;
        y[at] = (x[at] - m.mean) * m.rstd * gamma[c] + beta[c];
      }
  }
}

// The training-mode backward, the statistics recomputed from x:
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma over
// the channel's values; dgamma = sum dy * xhat, dbeta = sum dy.
template <typename T>
void batch_norm_backward(const T* dy, const T* x, const T* gamma, std::int64_t n, std::int64_t channels,
                         std::int64_t plane, double eps, T* dx, T* dgamma, T* dbeta) {
  const T count = static_cast<T>(n * plane);
  for (std::int64_t c = 0; c < channels; ++c) {
    const auto m = channel_moments(x, n, channels, plane, c, eps);
    double dy_total = 0.0, dyx_total = 0.0;  // (in double, as channel_moments)
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t k = 0; k < plane; ++k) {
        const std::int64_t at = (b * channels + c) * plane + k;
        dy_total += static_cast<double>(dy[at]);
        dyx_total += static_cast<double>(dy[at] * (x[at] - m.mean) * m.rstd);
      }
    const T dy_sum = static_cast<T>(dy_total), dyx_sum = static_cast<T>(dyx_total);
    dgamma[c] = dyx_sum;
    dbeta[c] = dy_sum;
    const T g_mean = gamma[c] * dy_sum / count, gx_mean = gamma[c] * dyx_sum / count;
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t k = 0; k < plane; ++k) {
        const std::int64_t at = (b * channels + c) * plane + k;
        const T xhat = (x[at] - m.mean) * m.rstd;
        dx[at] = m.rstd * (dy[at] * gamma[c] - g_mean - xhat * gx_mean);
      }
  }
}

// running = (1 - momentum) running + momentum * batch statistic, the
// variance unbiased (count / (count - 1)), as PyTorch's training forward.
template <typename T>
void batch_norm_stats_update(const T* x, std::int64_t n, std::int64_t channels, std::int64_t plane, double momentum,
                             T* running_mean, T* running_var) {
  const T count = static_cast<T>(n * plane), mo = static_cast<T>(momentum);
  for (std::int64_t c = 0; c < channels; ++c) {
    T var = T(0);
    const auto m = channel_moments(x, n, channels, plane, c, 1.0, &var);
    running_mean[c] = (T(1) - mo) * running_mean[c] + mo * m.mean;
    running_var[c] = (T(1) - mo) * running_var[c] + mo * var * count / (count - T(1));
  }
}

// Eval mode: the running statistics.
template <typename T>
void batch_norm_inference(const T* x, const T* gamma, const T* beta, const T* running_mean, const T* running_var,
                          std::int64_t n, std::int64_t channels, std::int64_t plane, double eps, T* y) {
  for (std::int64_t c = 0; c < channels; ++c) {
    const T rstd = T(1) / std::sqrt(running_var[c] + static_cast<T>(eps));
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t k = 0; k < plane; ++k) {
        const std::int64_t at = (b * channels + c) * plane + k;
        y[at] = (x[at] - running_mean[c]) * rstd * gamma[c] + beta[c];
      }
  }
}

}  // namespace sg::ref
