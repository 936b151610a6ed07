#pragma once
// The window poolings' shape rule and sizes (max_pool2d.cpp, avg_pool2d.cpp):
// square k x k windows at stride s, no padding, floored sizes, over
// [N,C,H,W] values or, with Pool2dAttrs::channels_last, [N,H,W,C] ones.
#include <cstdint>
#include <span>
#include <string>

#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {

// The dimension of H in a's layout (W follows it).
inline int pool_height_dim(const Pool2dAttrs& a) { return a.channels_last ? 1 : 2; }

// x pooled by a's window, in x's layout; `what` names x in errors.
inline Shape pooled_shape(OpKind op, const Shape& x, const std::string& what, const Pool2dAttrs& a) {
  if (a.kernel < 1 || a.stride < 1)
    fail(op, fmt::format("kernel {} and stride {} must be >= 1", a.kernel, a.stride));
  const int hd = pool_height_dim(a);
  if (x[hd] < a.kernel || x[hd + 1] < a.kernel)
    fail(op, fmt::format("kernel {}x{} is larger than the input {}", a.kernel, a.kernel, what));
  Shape y = x;
  y[hd] = (x[hd] - a.kernel) / a.stride + 1;
  y[hd + 1] = (x[hd + 1] - a.kernel) / a.stride + 1;
  return y;
}

// N, C, H, W of a value in the op's layout.
struct PoolPlanes {
  std::int64_t n, c, h, w;
  std::int64_t oh(const Pool2dAttrs& a) const { return (h - a.kernel) / a.stride + 1; }
  std::int64_t ow(const Pool2dAttrs& a) const { return (w - a.kernel) / a.stride + 1; }
};
inline PoolPlanes pool_planes(std::span<const std::int64_t> s, const Pool2dAttrs& a) {
  return a.channels_last ? PoolPlanes{s[0], s[3], s[1], s[2]} : PoolPlanes{s[0], s[1], s[2], s[3]};
}

}  // namespace sg::ops
