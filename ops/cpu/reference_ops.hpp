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

namespace sg::ref {

// idx[i] = perm[(step mod (n / batch)) * batch + i]: epoch-local batch `step`
// of the permutation; the tail n mod batch rows are dropped each epoch.
inline void batch_indices(const std::int32_t* perm, std::int64_t n, std::int32_t step, std::int64_t batch,
                          std::int32_t* idx) {
  const std::int64_t batches_per_epoch = n / batch;
  const std::int64_t first = (step % batches_per_epoch) * batch;
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

}  // namespace sg::ref
