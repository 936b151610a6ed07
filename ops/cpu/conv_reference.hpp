#pragma once
// CPU reference of the convolutional-network ops (issue 22): plain loops over
// NCHW row-major arrays, templated on the compute type like
// reference_ops.hpp. They are the oracle the CUDA lowerings will be checked
// against, so they favour obviousness over speed.
#include <cmath>
#include <cstdint>

#include "ops/philox.hpp"

namespace sg::ref {

// The sizes of one convolution: X [n,c,h,w], W [o,c,kh,kw], Y [n,o,oh,ow].
struct Conv2dGeometry {
  std::int64_t n = 1, c = 1, h = 1, w = 1;
  std::int64_t o = 1, kh = 1, kw = 1;
  std::int64_t stride = 1, padding = 0;
  std::int64_t oh() const { return (h + 2 * padding - kh) / stride + 1; }
  std::int64_t ow() const { return (w + 2 * padding - kw) / stride + 1; }
};

// Calls tap(y_index, x_index, w_index) for every product of the
// convolution, Y[n,o,y,x] += X[n,c,y*s-p+i,x*s-p+j] W[o,c,i,j], skipping the
// taps that fall in the zero padding; in the order n, o, y, x, c, i, j, so
// each Y element's terms arrive in (c, i, j) order. The forward and both
// backwards are this walk with a different accumulation.
template <typename Tap>
void for_each_conv_tap(const Conv2dGeometry& g, Tap&& tap) {
  const std::int64_t oh = g.oh(), ow = g.ow();
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t o = 0; o < g.o; ++o)
      for (std::int64_t oy = 0; oy < oh; ++oy)
        for (std::int64_t ox = 0; ox < ow; ++ox) {
          const std::int64_t yi = ((n * g.o + o) * oh + oy) * ow + ox;
          for (std::int64_t c = 0; c < g.c; ++c)
            for (std::int64_t i = 0; i < g.kh; ++i) {
              const std::int64_t iy = oy * g.stride - g.padding + i;
              if (iy < 0 || iy >= g.h) continue;
              for (std::int64_t j = 0; j < g.kw; ++j) {
                const std::int64_t ix = ox * g.stride - g.padding + j;
                if (ix < 0 || ix >= g.w) continue;
                tap(yi, ((n * g.c + c) * g.h + iy) * g.w + ix, ((o * g.c + c) * g.kh + i) * g.kw + j);
              }
            }
        }
}

// Y[n,o,y,x] = bias[o] + sum_{c,i,j} X[n,c,y*s-p+i,x*s-p+j] W[o,c,i,j], with
// zeros outside X. `bias` may be null.
template <typename T>
void conv2d(const T* x, const T* w, const T* bias, const Conv2dGeometry& g, T* y) {
  const std::int64_t plane = g.oh() * g.ow();
  for (std::int64_t i = 0; i < g.n * g.o * plane; ++i) y[i] = bias ? bias[(i / plane) % g.o] : T(0);
  for_each_conv_tap(g, [&](std::int64_t yi, std::int64_t xi, std::int64_t wi) { y[yi] += x[xi] * w[wi]; });
}

// dX = the adjoint of conv2d in X: every dY element scattered back through W.
template <typename T>
void conv2d_backward_data(const T* dy, const T* w, const Conv2dGeometry& g, T* dx) {
  for (std::int64_t i = 0; i < g.n * g.c * g.h * g.w; ++i) dx[i] = T(0);
  for_each_conv_tap(g, [&](std::int64_t yi, std::int64_t xi, std::int64_t wi) { dx[xi] += dy[yi] * w[wi]; });
}

// dW[o,c,i,j] = sum_{n,y,x} dY[n,o,y,x] X[n,c,y*s-p+i,x*s-p+j].
template <typename T>
void conv2d_backward_filter(const T* dy, const T* x, const Conv2dGeometry& g, T* dw) {
  for (std::int64_t i = 0; i < g.o * g.c * g.kh * g.kw; ++i) dw[i] = T(0);
  for_each_conv_tap(g, [&](std::int64_t yi, std::int64_t xi, std::int64_t wi) { dw[wi] += dy[yi] * x[xi]; });
}

// y[c] = sum over n and the `plane` elements of channel c of X [n, channels, plane].
template <typename T>
void channel_sum(const T* x, std::int64_t n, std::int64_t channels, std::int64_t plane, T* y) {
  for (std::int64_t c = 0; c < channels; ++c) {
    T acc = T(0);
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t k = 0; k < plane; ++k) acc += x[(b * channels + c) * plane + k];
    y[c] = acc;
  }
}

// Index (within its h x w plane) of the maximum of the window at output
// (oy, ox): the FIRST maximum in row-major window order wins a tie
// (PyTorch's max_pool2d rule), and a NaN wins over numbers so it propagates
// as in PyTorch (of several NaNs we take the first, PyTorch the last; the
// value is NaN either way).
template <typename T>
std::int64_t max_pool2d_argmax(const T* plane, std::int64_t w, std::int64_t kernel, std::int64_t stride,
                               std::int64_t oy, std::int64_t ox) {
  std::int64_t best = oy * stride * w + ox * stride;
  for (std::int64_t i = 0; i < kernel; ++i)
    for (std::int64_t j = 0; j < kernel; ++j) {
      const std::int64_t at = (oy * stride + i) * w + ox * stride + j;
      if (plane[at] > plane[best] || (std::isnan(plane[at]) && !std::isnan(plane[best]))) best = at;
    }
  return best;
}

// planes = N*C planes of h x w -> oh x ow maxima each (no padding, floor).
template <typename T>
void max_pool2d(const T* x, std::int64_t planes, std::int64_t h, std::int64_t w, std::int64_t kernel,
                std::int64_t stride, T* y) {
  const std::int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox)
        y[(p * oh + oy) * ow + ox] = x[p * h * w + max_pool2d_argmax(x + p * h * w, w, kernel, stride, oy, ox)];
}

// dX: each dY element added at its window's argmax (recomputed from X);
// overlapping windows (stride < kernel) accumulate.
template <typename T>
void max_pool2d_backward(const T* dy, const T* x, std::int64_t planes, std::int64_t h, std::int64_t w,
                         std::int64_t kernel, std::int64_t stride, T* dx) {
  const std::int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  for (std::int64_t i = 0; i < planes * h * w; ++i) dx[i] = T(0);
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox)
        dx[p * h * w + max_pool2d_argmax(x + p * h * w, w, kernel, stride, oy, ox)] += dy[(p * oh + oy) * ow + ox];
}

// PyTorch's Dropout2d in training mode: channel (b, c) of X [n, channels,
// plane] is kept with probability 1 - p and scaled by 1 / (1 - p), else
// zeroed whole. Its keep bit is dropout's Philox bit of "element" b *
// channels + c (philox::dropout_keep), so the GPU draws the same mask.
// channels_last: X is [n, plane, channels], the same channels dropped.
template <typename T>
void dropout2d(const T* x, std::int64_t n, std::int64_t channels, std::int64_t plane, double p, std::uint64_t seed,
               std::int64_t stream, std::int32_t step, T* y, bool channels_last = false) {
  const std::uint32_t threshold = philox::dropout_threshold(p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t c = 0; c < channels; ++c) {
      const bool keep = philox::dropout_keep(seed, stream, step, b * channels + c, threshold);
      for (std::int64_t k = 0; k < plane; ++k) {
        const std::int64_t i = channels_last ? (b * plane + k) * channels + c : (b * channels + c) * plane + k;
        y[i] = keep ? x[i] * scale : T(0);
      }
    }
}

}  // namespace sg::ref
