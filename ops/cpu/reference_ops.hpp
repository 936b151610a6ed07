#pragma once
// CPU reference kernels: the oracle for every CUDA kernel and the executor of
// the CPU backend. Plain loops over row-major arrays, templated on the compute
// type T (float or double). Each function states the op's exact semantics;
// the CUDA twins in ops/cuda implement the same contract.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/philox.hpp"

namespace sg::ref {

// idx[i] = perm[(step mod (n / G)) * G + rank * batch + i] with the global
// batch G = ranks * batch: rank `rank`'s `batch` rows of the epoch-local
// global batch `step` of the permutation (one rank: G = batch); the tail
// n mod G rows are dropped each epoch.
inline void batch_indices(const std::int32_t* perm, std::int64_t n, std::int32_t step, std::int64_t batch,
                          std::int32_t* idx, std::int64_t rank = 0, std::int64_t ranks = 1) {
  const std::int64_t global = batch * ranks;
  const std::int64_t batches_per_epoch = n / global;
  const std::int64_t first = (step % batches_per_epoch) * global + rank * batch;
  for (std::int64_t i = 0; i < batch; ++i) idx[i] = perm[first + i];
}

// out[i, :] = table[idx[i], :] * scale + shift, for `rows` indices of `cols` columns.
template <typename T, typename Table>
void gather_rows(const Table* table, const std::int32_t* idx, std::int64_t rows, std::int64_t cols, T scale,
                 T shift, T* out) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = static_cast<T>(table[static_cast<std::int64_t>(idx[i]) * cols + j]) * scale + shift;
}

// out[i, :] = table[idx[i], :] (integer tables: labels).
template <typename Table>
void gather_rows_int(const Table* table, const std::int32_t* idx, std::int64_t rows, std::int64_t cols,
                     std::int32_t* out) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = static_cast<std::int32_t>(table[static_cast<std::int64_t>(idx[i]) * cols + j]);
}

// C[m,n] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T; A is [m,k] (or
// [k,m] when trans_a), B is [k,n] (or [n,k] when trans_b). beta = 0 ignores C.
// Loop order keeps the innermost loop contiguous (row updates when B is not
// transposed, dot products when it is) so the CPU fallback trains in seconds.
template <typename T>
void matmul(const T* a, const T* b, T* c, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a,
            bool trans_b, T alpha = T(1), T beta = T(0)) {
  std::vector<T> row(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), T(0));
    for (std::int64_t p = 0; p < k && !trans_b; ++p) {
      const T av = trans_a ? a[p * m + i] : a[i * k + p];
      const T* brow = b + p * n;
      for (std::int64_t j = 0; j < n; ++j) row[j] += av * brow[j];
    }
    for (std::int64_t j = 0; j < n && trans_b; ++j) {
      const T* bcol = b + j * k;
      T acc = T(0);
      for (std::int64_t p = 0; p < k; ++p) acc += (trans_a ? a[p * m + i] : a[i * k + p]) * bcol[p];
      row[j] = acc;
    }
    for (std::int64_t j = 0; j < n; ++j)
      c[i * n + j] = alpha * row[j] + (beta == T(0) ? T(0) : beta * c[i * n + j]);
  }
}

// y[i, j] = x[i, j] + bias[j]
template <typename T>
void bias_add(const T* x, const T* bias, std::int64_t rows, std::int64_t cols, T* y) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) y[i * cols + j] = x[i * cols + j] + bias[j];
}

template <typename T>
void relu(const T* x, std::int64_t n, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
}

// dx = dy where the forward output y was positive, else 0.
template <typename T>
void relu_backward(const T* dy, const T* y, std::int64_t n, T* dx) {
  for (std::int64_t i = 0; i < n; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
}

// Exact GELU (not the tanh approximation): y = x * Phi(x) = x * 0.5 * (1 + erf(x / sqrt(2))).
template <typename T>
void gelu(const T* x, std::int64_t n, T* y) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * T(0.5) * (T(1) + std::erf(x[i] * inv_sqrt2));
}

// dx = dy * gelu'(x), gelu'(x) = Phi(x) + x * phi(x) = 0.5 * (1 + erf(x / sqrt(2))) + x * exp(-x^2 / 2) / sqrt(2 pi),
// with x the forward INPUT.
template <typename T>
void gelu_backward(const T* dy, const T* x, std::int64_t n, T* dx) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  const T inv_sqrt_2pi = T(0.39894228040143267794);
  for (std::int64_t i = 0; i < n; ++i) {
    const T cdf = T(0.5) * (T(1) + std::erf(x[i] * inv_sqrt2));
    const T pdf = inv_sqrt_2pi * std::exp(T(-0.5) * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}

template <typename T>
void add(const T* a, const T* b, std::int64_t n, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// Numerically stable row softmax probability of column j.
template <typename T>
T softmax_prob(const T* row, std::int64_t cols, std::int64_t j) {
  T mx = row[0];
  for (std::int64_t c = 1; c < cols; ++c) mx = std::max(mx, row[c]);
  T sum = T(0);
  for (std::int64_t c = 0; c < cols; ++c) sum += std::exp(row[c] - mx);
  return std::exp(row[j] - mx) / sum;
}

// loss = mean over rows of -log softmax(logits[i])[labels[i]]
template <typename T>
T softmax_xent(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols) {
  T total = T(0);
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* row = logits + i * cols;
    T mx = row[0];
    for (std::int64_t c = 1; c < cols; ++c) mx = std::max(mx, row[c]);
    T sum = T(0);
    for (std::int64_t c = 0; c < cols; ++c) sum += std::exp(row[c] - mx);
    total += std::log(sum) + mx - row[labels[i]];
  }
  return total / static_cast<T>(rows);
}

// dlogits[i, j] = (softmax(logits[i])[j] - [j == labels[i]]) / rows
template <typename T>
void softmax_xent_backward(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                           T* dlogits) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      dlogits[i * cols + j] =
          (softmax_prob(logits + i * cols, cols, j) - (labels[i] == j ? T(1) : T(0))) / static_cast<T>(rows);
}

// Number of rows whose first maximal logit sits at the label.
template <typename T>
std::int32_t count_correct(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols) {
  std::int32_t hits = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* row = logits + i * cols;
    const auto best = std::max_element(row, row + cols) - row;
    hits += best == labels[i] ? 1 : 0;
  }
  return hits;
}

// y[j] = sum_i x[i, j]
template <typename T>
void reduce_rows(const T* x, std::int64_t rows, std::int64_t cols, T* y) {
  for (std::int64_t j = 0; j < cols; ++j) {
    T acc = T(0);
    for (std::int64_t i = 0; i < rows; ++i) acc += x[i * cols + j];
    y[j] = acc;
  }
}

// PyTorch's SGD (dampening 0, no Nesterov): g' = g + wd * w;
// with momentum: v = momentum * v + g', w -= lr * v; without: w -= lr * g'.
template <typename T>
void sgd_update(T* w, const T* g, T* velocity, std::int64_t n, T lr, T momentum, T weight_decay) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T grad = g[i] + weight_decay * w[i];
    if (velocity) {
      velocity[i] = momentum * velocity[i] + grad;
      w[i] -= lr * velocity[i];
    } else {
      w[i] -= lr * grad;
    }
  }
}

// ---- issue 21: activations, regression losses, label smoothing, dropout

// GELU, tanh approximation (PyTorch's gelu(approximate='tanh'), cuBLASLt's
// GELU epilogue): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
void gelu_tanh(const T* x, std::int64_t n, T* y) {
  const T k = T(0.79788456080286535588), c = T(0.044715);
  for (std::int64_t i = 0; i < n; ++i) y[i] = T(0.5) * x[i] * (T(1) + std::tanh(k * (x[i] + c * x[i] * x[i] * x[i])));
}

// dx = dy * d/dx gelu_tanh(x), x the forward INPUT:
// 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(k (x + c x^3)).
template <typename T>
void gelu_tanh_backward(const T* dy, const T* x, std::int64_t n, T* dx) {
  const T k = T(0.79788456080286535588), c = T(0.044715);
  for (std::int64_t i = 0; i < n; ++i) {
    const T t = std::tanh(k * (x[i] + c * x[i] * x[i] * x[i]));
    dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * x[i] * (T(1) - t * t) * k * (T(1) + T(3) * c * x[i] * x[i]));
  }
}

template <typename T>
T sigmoid_of(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// SiLU (swish): y = x * sigmoid(x).
template <typename T>
void silu(const T* x, std::int64_t n, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_of(x[i]);
}

// dx = dy * s (1 + x (1 - s)), s = sigmoid(x), x the forward INPUT.
template <typename T>
void silu_backward(const T* dy, const T* x, std::int64_t n, T* dx) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T s = sigmoid_of(x[i]);
    dx[i] = dy[i] * s * (T(1) + x[i] * (T(1) - s));
  }
}

template <typename T>
void tanh(const T* x, std::int64_t n, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

// dx = dy * (1 - y^2), y the forward OUTPUT.
template <typename T>
void tanh_backward(const T* dy, const T* y, std::int64_t n, T* dx) {
  for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (T(1) - y[i] * y[i]);
}

template <typename T>
void sigmoid(const T* x, std::int64_t n, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = sigmoid_of(x[i]);
}

// dx = dy * y (1 - y), y the forward OUTPUT.
template <typename T>
void sigmoid_backward(const T* dy, const T* y, std::int64_t n, T* dx) {
  for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (T(1) - y[i]);
}

// PyTorch MSELoss() (mean over all n elements): mean (pred - target)^2.
template <typename T, typename Target>
T mse_loss(const T* pred, const Target* target, std::int64_t n) {
  T total = T(0);
  for (std::int64_t i = 0; i < n; ++i) {
    const T d = pred[i] - static_cast<T>(target[i]);
    total += d * d;
  }
  return total / static_cast<T>(n);
}

// dpred = 2 (pred - target) / n
template <typename T, typename Target>
void mse_loss_backward(const T* pred, const Target* target, std::int64_t n, T* dpred) {
  for (std::int64_t i = 0; i < n; ++i) dpred[i] = T(2) * (pred[i] - static_cast<T>(target[i])) / static_cast<T>(n);
}

// PyTorch L1Loss() (mean over all n elements): mean |pred - target|.
template <typename T, typename Target>
T l1_loss(const T* pred, const Target* target, std::int64_t n) {
  T total = T(0);
  for (std::int64_t i = 0; i < n; ++i) total += std::abs(pred[i] - static_cast<T>(target[i]));
  return total / static_cast<T>(n);
}

// dpred = sign(pred - target) / n, sign(0) = 0 (PyTorch's L1Loss gradient).
template <typename T, typename Target>
void l1_loss_backward(const T* pred, const Target* target, std::int64_t n, T* dpred) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T d = pred[i] - static_cast<T>(target[i]);
    dpred[i] = (d > T(0) ? T(1) : d < T(0) ? T(-1) : T(0)) / static_cast<T>(n);
  }
}

// PyTorch CrossEntropyLoss(label_smoothing=eps), mean over rows: the target
// row is (1 - eps) onehot(label) + eps / cols, so a row's loss is
// (1 - eps) (lse - x_label) + eps (lse - mean_c x_c), lse = log sum exp x.
template <typename T>
T softmax_xent_smoothed(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols, T eps) {
  T total = T(0);
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* row = logits + i * cols;
    T mx = row[0];
    for (std::int64_t c = 1; c < cols; ++c) mx = std::max(mx, row[c]);
    T sum = T(0), row_sum = T(0);
    for (std::int64_t c = 0; c < cols; ++c) {
      sum += std::exp(row[c] - mx);
      row_sum += row[c];
    }
    const T lse = std::log(sum) + mx;
    total += (T(1) - eps) * (lse - row[labels[i]]) + eps * (lse - row_sum / static_cast<T>(cols));
  }
  return total / static_cast<T>(rows);
}

// dlogits[i, j] = (softmax(logits[i])[j] - (1 - eps) [j == labels[i]] - eps / cols) / rows
template <typename T>
void softmax_xent_smoothed_backward(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                                    T eps, T* dlogits) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      dlogits[i * cols + j] = (softmax_prob(logits + i * cols, cols, j) -
                               (labels[i] == j ? T(1) - eps : T(0)) - eps / static_cast<T>(cols)) /
                              static_cast<T>(rows);
}

// Inverted dropout (PyTorch's): y[i] = x[i] / (1 - p) where element i is kept
// at this step, else 0; the keep bits come from philox::dropout_keep, so the
// backward (same call with dy) recomputes the forward's mask.
template <typename T>
void dropout(const T* x, std::int64_t n, double p, std::uint64_t seed, std::int64_t stream, std::int32_t step, T* y) {
  const std::uint32_t threshold = philox::dropout_threshold(p);
  const T scale = p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = philox::dropout_keep(seed, stream, step, i, threshold) ? x[i] * scale : T(0);
}

// ---- issue 21: optimizers and gradient clipping (PyTorch's formulas)

// SGD(nesterov=True), dampening 0: g' = g + wd * w; v = momentum * v + g';
// w -= lr * (g' + momentum * v).
template <typename T>
void sgd_nesterov_update(T* w, const T* g, T* velocity, std::int64_t n, T lr, T momentum, T weight_decay) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T grad = g[i] + weight_decay * w[i];
    velocity[i] = momentum * velocity[i] + grad;
    w[i] -= lr * (grad + momentum * velocity[i]);
  }
}

// One Adam / AdamW step at step number t (1-based), the gradient scaled by
// `grad_scale` first (gradient clipping; 1 without it). Adam adds wd * w to
// the gradient; AdamW (decoupled) multiplies w by 1 - lr * wd. Then
// m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
// w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
template <typename T>
void adam_update(T* w, const T* g, T* m, T* v, std::int64_t n, T lr, T beta1, T beta2, T eps, T weight_decay,
                 bool decoupled, std::int64_t t, T grad_scale) {
  const T bias1 = T(1) - std::pow(beta1, static_cast<T>(t));
  const T bias2_sqrt = std::sqrt(T(1) - std::pow(beta2, static_cast<T>(t)));
  const T step_size = lr / bias1;
  for (std::int64_t i = 0; i < n; ++i) {
    T grad = g[i] * grad_scale;
    if (decoupled) w[i] *= T(1) - lr * weight_decay;
    else grad += weight_decay * w[i];
    m[i] = beta1 * m[i] + (T(1) - beta1) * grad;
    v[i] = beta2 * v[i] + (T(1) - beta2) * grad * grad;
    w[i] -= step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
  }
}

// PyTorch's RMSprop (torch.optim.RMSprop) on n elements: g = g * grad_scale
// + weight_decay * w; square_avg = alpha square_avg + (1 - alpha) g^2;
// centered: grad_avg = alpha grad_avg + (1 - alpha) g and
// avg = sqrt(square_avg - grad_avg^2) + eps, else avg = sqrt(square_avg) + eps;
// momentum > 0: buf = momentum buf + g / avg, w -= lr buf; else w -= lr g / avg.
// `momentum_buf` is used only with momentum > 0, `grad_avg` only when centered.
template <typename T>
void rmsprop_update(T* w, const T* g, T* square_avg, T* momentum_buf, T* grad_avg, std::int64_t n, T lr, T alpha,
                    T eps, T weight_decay, T momentum, bool centered, T grad_scale) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T grad = g[i] * grad_scale + weight_decay * w[i];
    square_avg[i] = alpha * square_avg[i] + (T(1) - alpha) * grad * grad;
    T mean_square = square_avg[i];
    if (centered) {
      grad_avg[i] = alpha * grad_avg[i] + (T(1) - alpha) * grad;
      mean_square -= grad_avg[i] * grad_avg[i];
    }
    const T step = grad / (std::sqrt(mean_square) + eps);
    if (momentum > T(0)) {
      momentum_buf[i] = momentum * momentum_buf[i] + step;
      w[i] -= lr * momentum_buf[i];
    } else {
      w[i] -= lr * step;
    }
  }
}

// torch.nn.utils.clip_grad_norm_'s factor from the sum of squares of every
// gradient element: min(1, max_norm / (sqrt(sum) + 1e-6)).
template <typename T>
T clip_scale_from_sum_of_squares(T sum_of_squares, T max_norm) {
  return std::min(T(1), max_norm / (std::sqrt(sum_of_squares) + T(1e-6)));
}

template <typename T>
T sum_of_squares(const T* x, std::int64_t n) {
  T acc = T(0);
  for (std::int64_t i = 0; i < n; ++i) acc += x[i] * x[i];
  return acc;
}

// y = x * scale
template <typename T>
void scale_grad(const T* x, std::int64_t n, T scale, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
}

}  // namespace sg::ref
