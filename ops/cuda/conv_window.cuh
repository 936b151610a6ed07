#pragma once
// Where a convolution's windows sit (zero padding p on both sides, stride s,
// k taps along an axis), in one place: the implicit-GEMM and direct kernels
// (conv_implicit_gemm.cu, conv_direct.cu) and the CNN step's convolutions
// (fast_paths/cnn_step) index their inputs through these.
namespace sg::cuda {

// The input coordinate of output o's first tap (tap i reads origin + i).
template <typename I>
__host__ __device__ __forceinline__ I window_origin(I o, I stride, I padding) {
  return o * stride - padding;
}

// The data gradient at stride 1 is a correlation of dY with the flipped
// kernel; dY is read with this border (k - 1 - p) around it.
template <typename I>
__host__ __device__ __forceinline__ I transposed_padding(I kernel, I padding) {
  return kernel - 1 - padding;
}

// Tap t of the flipped kernel along an axis of `taps` taps (over all kh * kw
// taps in row-major order, the reversed index flips both axes).
template <typename I>
__host__ __device__ __forceinline__ I flipped_tap(I tap, I taps) {
  return taps - 1 - tap;
}

}  // namespace sg::cuda
