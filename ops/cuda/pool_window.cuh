#pragma once
// The max-pool window (square k x k at stride s, no padding), in one place:
// the max_pool2d kernels (pooling.cu) and the CNN step's pooling layers
// (fast_paths/cnn_step) call these, so a window's maximum, its tie and NaN
// rules and the windows an input element falls in are the same everywhere.
namespace sg::cuda {

// A window's maximum: `at`, the index of its first maximum in the plane, and
// its value.
template <typename I>
struct WindowMax {
  I at;
  float value;
};

// Window (oy, ox) of a plane `w` wide, its values read through
// value_at(index in the plane). As ref::max_pool2d_argmax: the first
// maximum in row-major window order wins a tie, and a NaN wins over numbers
// (the first NaN of several).
template <typename I, typename ValueAt>
__device__ __forceinline__ WindowMax<I> window_max(ValueAt&& value_at, I w, I kernel, I stride, I oy, I ox) {
  const I corner = oy * stride * w + ox * stride;
  WindowMax<I> best{corner, value_at(corner)};
  for (I i = 0; i < kernel; ++i)
    for (I j = 0; j < kernel; ++j) {
      const I at = corner + i * w + j;
      const float v = value_at(at);
      if (best.value == best.value && !(v <= best.value)) {  // best a number, v above it or NaN
        best.at = at;
        best.value = v;
      }
    }
  return best;
}

// The windows (oy, ox) with oy in [lo, hi] that contain input row (or
// column) y: oy*s <= y < oy*s + k, within [0, out).
template <typename I>
struct WindowRange {
  I lo, hi;
};
template <typename I>
__device__ __forceinline__ WindowRange<I> windows_containing(I y, I kernel, I stride, I out) {
  return {y >= kernel ? (y - kernel) / stride + 1 : I(0), y / stride < out ? y / stride : out - 1};
}

// A window pixel's share of the output's gradient when windows tile the
// input (each pixel in one window): `grad` where it holds the window's first
// maximum, else 0. Written as the gather's f32 sum of its one term (0 + grad),
// so a -0 gradient arrives as the gathering kernels' +0.
__device__ __forceinline__ float tiled_window_gradient(bool first_max, float grad) {
  return first_max ? 0.f + grad : 0.f;
}

}  // namespace sg::cuda
