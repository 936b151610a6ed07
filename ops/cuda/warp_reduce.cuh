#pragma once
// Max and sum over aligned groups of `Lanes` lanes of a warp (xor butterfly;
// 32: the whole warp, every lane gets the result). Every kernel that reduces
// across lanes uses these, so equal inputs give equal bits everywhere.
namespace sg::cuda {

template <int Lanes = 32>
__device__ __forceinline__ float warp_max(float v) {
  for (int o = Lanes / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int Lanes = 32>
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = Lanes / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace sg::cuda
