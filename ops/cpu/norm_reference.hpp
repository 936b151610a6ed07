#pragma once
// CPU reference of layer normalisation (issue 37), PyTorch's LayerNorm over
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

}  // namespace sg::ref
