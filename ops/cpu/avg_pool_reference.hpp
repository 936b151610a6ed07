#pragma once
// CPU reference of mean pooling (issue 37): avg_pool2d over square windows
// with no padding (PyTorch's AvgPool2d(kernel, stride): every window is whole,
// so the divisor is always kernel^2), and global_avg_pool2d, the mean of
// each plane (AdaptiveAvgPool2d(1)). Sums run in the window's row-major
// order and are divided once at the end, as PyTorch's CPU kernels do; the
// backwards divide each incoming gradient first and add the windows that
// cover an element in (oy, ox) order (the CUDA kernels gather in the same
// order, so f32 results agree bit for bit).
#include <cstdint>

namespace sg::ref {

// planes = N*C planes of h x w -> oh x ow window means each.
template <typename T>
void avg_pool2d(const T* x, std::int64_t planes, std::int64_t h, std::int64_t w, std::int64_t kernel,
                std::int64_t stride, T* y) {
  const std::int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  const T area = static_cast<T>(kernel * kernel);
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        T acc = T(0);
        for (std::int64_t i = 0; i < kernel; ++i)
          for (std::int64_t j = 0; j < kernel; ++j) acc += x[(p * h + oy * stride + i) * w + ox * stride + j];
        y[(p * oh + oy) * ow + ox] = acc / area;
      }
}

// dX [planes, h, w]: each dY element divided by kernel^2 and added over its
// window; overlapping windows (stride < kernel) accumulate, elements no
// window covers (the floor's remainder, gapped strides) get 0.
template <typename T>
void avg_pool2d_backward(const T* dy, std::int64_t planes, std::int64_t h, std::int64_t w, std::int64_t kernel,
                         std::int64_t stride, T* dx) {
  const std::int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  const T area = static_cast<T>(kernel * kernel);
  for (std::int64_t i = 0; i < planes * h * w; ++i) dx[i] = T(0);
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        const T share = dy[(p * oh + oy) * ow + ox] / area;
        for (std::int64_t i = 0; i < kernel; ++i)
          for (std::int64_t j = 0; j < kernel; ++j) dx[(p * h + oy * stride + i) * w + ox * stride + j] += share;
      }
}

// y[p] = the mean of plane p's `plane` elements.
template <typename T>
void global_avg_pool2d(const T* x, std::int64_t planes, std::int64_t plane, T* y) {
  for (std::int64_t p = 0; p < planes; ++p) {
    T acc = T(0);
    for (std::int64_t k = 0; k < plane; ++k) acc += x[p * plane + k];
    y[p] = acc / static_cast<T>(plane);
  }
}

// dx[p, k] = dy[p] / plane for every element k of plane p.
template <typename T>
void global_avg_pool2d_backward(const T* dy, std::int64_t planes, std::int64_t plane, T* dx) {
  for (std::int64_t p = 0; p < planes; ++p) {
    const T share = dy[p] / static_cast<T>(plane);
    for (std::int64_t k = 0; k < plane; ++k) dx[p * plane + k] = share;
  }
}

}  // namespace sg::ref
